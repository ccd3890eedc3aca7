"""The SLURM job script `vit-ablate sweep --print-sbatch` prints, for either backend."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path


def vit_ablate_command() -> tuple[str, ...]:
    """`vit-ablate` from this environment, by absolute path (a job script runs without an activated venv)."""
    script = Path(sys.executable).with_name("vit-ablate")
    return (str(script),) if script.exists() else (sys.executable, "-m", "vit_lightning.cli")


CPU_CAP = 64  # CPUs a script asks per node at most: many 8-GPU nodes have no more (sbatch refuses a larger ask)


def sbatch_script(sweep_argv: list[str], job_name: str, gpus: int, cpus: int, shares: str) -> str:
    """A job script for `sbatch` running one `vit-ablate sweep` on one node; `sbatch --array=1-N` for N nodes.

    Built from its arguments alone (the login node's GPUs do not matter): `sweep_argv` is the `vit-ablate sweep`
    command it runs, `gpus` the node's GPUs, `cpus` the CPUs its trials' loaders and processes need (capped at
    CPU_CAP, with a line to edit), `shares` a line saying how the jobs of one script share the work. The time,
    partition and account are lines to edit. Two minutes before the time limit SLURM sends SIGUSR1 to the script
    alone: it passes it on to the sweep, which stops its trials (SIGTERM) while they can still checkpoint and logs
    the stop as the time limit, then requeues the job, so they go on without a human. `scancel` and pre-emption
    send SIGTERM to every process of the job: the sweep stops its trials once (the script's forwarded copy, and a
    time-limit signal after it, are the same stop) and the job stays stopped, or, pre-empted, goes back to the
    queue through --requeue. The log is appended to across requeues, one per job (`%x-%j.out`: job name, job id;
    an array task has a job id of its own, and `%a` would be 4294967294 in a job submitted without --array).
    """
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    why = "data.num_workers per GPU (split among the trials sharing it), plus one per trial process"
    if cpus > CPU_CAP:
        lines.append(f"#SBATCH --cpus-per-task={CPU_CAP}   # edit: {cpus} wanted ({why}), at most the node's CPUs")
    else:
        lines.append(f"#SBATCH --cpus-per-task={cpus}   # {why}")
    lines += ["#SBATCH --mem=0                # all of the node's memory; give a size on shared nodes",
              "#SBATCH --time=24:00:00        # edit: at most your partition's time limit",
              "##SBATCH --partition=NAME      # edit, and remove one '#', to choose a partition",
              "##SBATCH --account=NAME        # edit, and remove one '#', to charge an account",
              "#SBATCH --signal=B:USR1@120", "#SBATCH --requeue", "#SBATCH --open-mode=append",
              "#SBATCH --output=%x-%j.out",
              f"# {shares}",
              f"cd {shlex.quote(os.getcwd())}",
              "# In the background, so the signals reach this script at once. USR1 (the time limit is near): the sweep",
              "# stops for it, then this job is requeued. TERM (scancel, pre-emption): stop the sweep, and stay stopped.",
              f"{shlex.join(sweep_argv)} &",
              'pid=$!',
              'trap \'kill -USR1 "$pid"; requeue=1\' USR1',
              'trap \'kill -TERM "$pid"; cancelled=1\' TERM',
              'wait "$pid"; code=$?',
              'while kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done  # a signal ended the wait, not the sweep',
              'if [ -n "${requeue:-}" ] && [ -z "${cancelled:-}" ]; then',
              '    job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}',
              '    scontrol requeue "${job:-$SLURM_JOB_ID}" || echo "vit-ablate: could not requeue this job" >&2',
              'fi', 'exit "$code"']
    return "\n".join(lines)

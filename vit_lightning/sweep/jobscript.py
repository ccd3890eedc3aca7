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


def sbatch_script(sweep_argv: list[str], job_name: str, gpus: int, cpus: int, shares: str) -> str:
    """A job script for `sbatch` running one `vit-ablate sweep` on one node; `sbatch --array=1-N` for N nodes.

    Built from its arguments alone (the login node's GPUs do not matter): `sweep_argv` is the `vit-ablate sweep`
    command it runs, `gpus` the node's GPUs, `cpus` the CPUs its trials' loaders and processes need, `shares` a
    line saying how the jobs of one script share the work. The time, partition and account are lines to edit.
    SIGTERM two minutes before the time limit stops the trials while they can still checkpoint, and the job then
    requeues itself, so they go on without a human; --requeue puts a pre-empted job back in the queue; the log
    is appended to across requeues.
    """
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    lines += [f"#SBATCH --cpus-per-task={cpus}   # data.num_workers per GPU, plus one per trial process",
              "#SBATCH --mem=0                # all of the node's memory; give a size on shared nodes",
              "#SBATCH --time=24:00:00        # edit: at most your partition's time limit",
              "##SBATCH --partition=NAME      # edit, and remove one '#', to choose a partition",
              "##SBATCH --account=NAME        # edit, and remove one '#', to charge an account",
              "#SBATCH --signal=B:TERM@120", "#SBATCH --requeue", "#SBATCH --open-mode=append",
              "#SBATCH --output=%x-%j.out",
              f"# {shares}",
              f"cd {shlex.quote(os.getcwd())}",
              "# In the background, so the time limit's SIGTERM reaches the sweep now; then this job requeues itself.",
              f"{shlex.join(sweep_argv)} &",
              'pid=$!', 'trap \'kill -TERM "$pid"; stopped=1\' TERM', 'wait "$pid"; code=$?',
              'if [ -n "${stopped:-}" ]; then',
              '    wait "$pid"; code=$?',
              '    job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}',
              '    scontrol requeue "${job:-$SLURM_JOB_ID}" || echo "vit-ablate: could not requeue this job" >&2',
              'fi', 'exit "$code"']
    return "\n".join(lines)

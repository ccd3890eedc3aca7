"""Whether the SLURM tasks `srun` started can be this fit's DDP processes: checked before anything trains."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

from vit_lightning.core.identity import normalize, world_size


def task_error(config: dict, env: Mapping[str, str] = os.environ) -> str | None:
    """Why the allocation's task layout cannot run this fit (one line), or None.

    Lightning takes each srun task for one process of the run: the tasks must be trainer.devices per node on
    trainer.num_nodes nodes. Otherwise each task fails on its own (with `srun -n`), or several tasks train
    the same run dir at once (`--ntasks-per-node` above trainer.devices).
    """
    if "SLURM_NTASKS" not in env or SLURMEnvironment.job_name() in ("bash", "interactive"):
        return None
    ntasks, per_node = int(env["SLURM_NTASKS"]), env.get("SLURM_NTASKS_PER_NODE")
    nodes = int(normalize(config.get("trainer.num_nodes")) or 1)
    if ntasks > 1 and per_node is None:
        return (f"SLURM started {ntasks} tasks with --ntasks (srun -n); Lightning needs them per node: "
                f"use --ntasks-per-node={max(1, ntasks // nodes)} with --trainer.devices={max(1, ntasks // nodes)}")
    processes = world_size(config, torch.cuda.device_count())
    if processes != ntasks:
        # more processes than tasks: fit ran without srun (a job with --ntasks-per-node=1), or srun gave too few
        fewer = (f", or start fit with srun and --ntasks-per-node={processes // nodes}, or drop --ntasks-per-node "
                 f"so that Lightning starts the {processes} processes itself") if processes > ntasks else ""
        return (f"SLURM started {ntasks} task(s) but trainer.devices={config.get('trainer.devices')} x "
                f"trainer.num_nodes={nodes} makes {processes} process(es): give --trainer.devices equal to "
                f"--ntasks-per-node ({per_node}) and --trainer.num_nodes to --nodes{fewer}")
    return None

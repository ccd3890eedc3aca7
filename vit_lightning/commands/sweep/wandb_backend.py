"""W&B backend: find or create the sweep(s) on the server and run `wandb agent` processes, one per GPU group.

Each agent gets its own CUDA_VISIBLE_DEVICES group, split as the local backend splits its slots;
the GPU profiles set trainer.devices=auto, so every trial uses all GPUs of its agent's group (DDP
when more than one). The agents are started and stopped by the shared supervisor. An 8-GPU node
runs 8 agents of 1 GPU (default), 4 agents of 2 (`--gpus-per-agent 2`) or 1 agent of 8.
When an ablation needs several grid sweeps, each agent works through them in order.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_lightning.commands.sweep.supervise import Supervisor, slot_envs
from vit_lightning.commands.sweep.validate import SweepError
from vit_lightning.compat.wandb import credentials as wandb_credentials
from vit_lightning.compat.wandb import env_mode
from vit_lightning.core.identity import normalize

# What makes Lightning take a process for one task that `srun` started (SLURMEnvironment.detect). Inside an
# allocation the agents start their trials themselves, and each trial's DDP ranks are Lightning's to start.
SLURM_TASK_VARS = ("SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NPROCS")
SWEEP_KEYS = ("name", "method", "metric", "command", "parameters")  # what makes two sweeps the same


@dataclass(frozen=True)
class Agent:
    """One agent slot: the `wandb agent` commands it runs one after another, and its environment overlay."""

    commands: tuple[tuple[str, ...], ...]
    env: dict[str, str]

    def shell(self) -> str:
        """The slot as one readable line (for the log)."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{prefix} {'; '.join(shlex.join(c) for c in self.commands)}".strip()


def has_credentials() -> bool:
    """True when W&B is on and can log in without asking (see compat/wandb.py)."""
    if env_mode() in ("disabled", "offline"):
        return False
    return wandb_credentials()


def agent_env(base: Mapping[str, str], overlay: Mapping[str, str]) -> dict[str, str]:
    """The environment of one agent (and so of its trials): `base` plus its slot's overlay.

    This environment's bin folder comes first on PATH, so the sweep command's `vit-ablate` (and `python`)
    resolve to this installation without an activated venv; a SLURM allocation's task layout is removed,
    so Lightning starts each trial's DDP processes itself instead of waiting for `srun` to have started them.
    """
    env = {k: v for k, v in base.items() if k not in SLURM_TASK_VARS}
    here = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([here, *(p for p in base.get("PATH", "").split(os.pathsep) if p and p != here)])
    return {**env, **overlay}


def agent_commands(sweep_paths: list[str], groups: list[list[str]], count: int | None = None,
                   wandb_cmd: tuple[str, ...] = ("wandb",), per_group: int = 1) -> list[Agent]:
    """The agents to start: each runs `wandb agent [--count N] ENTITY/PROJECT/ID` for every sweep, pinned to its group
    (`per_group` agents on each group, each with its share of the loader workers: supervise.slot_envs)."""
    # --forward-signals: the agent relays our SIGINT/SIGTERM to its run (which sits in its own process group)
    extra = ("--forward-signals",) + (("--count", str(count)) if count else ())
    commands = tuple((*wandb_cmd, "agent", *extra, path) for path in sweep_paths)
    return [Agent(commands, env) for env in slot_envs(groups, per_group=per_group)]


def check_devices(configs: list[dict], group_size: int) -> None:
    """A fixed integer trainer.devices must equal the GPUs each agent gets."""
    for config in configs:
        spec = config["parameters"].get("trainer.devices", {})
        values = [spec["value"]] if "value" in spec else spec.get("values", [])
        accel = config["parameters"].get("trainer.accelerator", {}).get("value")
        for v in values:
            if group_size and accel != "cpu" and isinstance(v, int) and v != group_size:
                raise SweepError(
                    f"trainer.devices={v} but each agent gets {group_size} GPU(s); "
                    f"use --gpus-per-agent {v} or --set trainer.devices=auto"
                )


def same_sweep(server: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """A sweep on the server runs exactly our sweep config (name, method, metric, command, parameters)."""
    return all(normalize(server.get(key)) == normalize(ours.get(key)) for key in SWEEP_KEYS)


def find_or_create_sweeps(configs: list[dict], project: str, entity: str | None, api: Any = None) -> list[str]:
    """ENTITY/PROJECT/ID of each sweep: the project's existing sweep with the same config, else a new one.

    So running the same command again (another node, a requeued job) joins the sweeps instead of
    starting them over; a changed setting (`--set`) is a new sweep.
    """
    import wandb

    api = api or wandb.Api()
    entity = entity or api.default_entity  # explicit in every path we hand out
    try:
        existing = list(api.project(project, entity=entity).sweeps())
    except ValueError:  # no such project yet
        existing = []
    paths = []
    for config in configs:
        match = next((sweep for sweep in existing if same_sweep(sweep.config, config)), None)
        sweep_id = match.id if match else wandb.sweep(config, project=project, entity=entity)
        paths.append("/".join(part for part in (entity, project, sweep_id) if part))
    return paths


def wandb_command() -> tuple[str, ...]:
    """`wandb` from this environment (the script next to python), else `python -m wandb`."""
    script = Path(sys.executable).with_name("wandb")
    return (str(script),) if script.exists() else (sys.executable, "-m", "wandb")


def run_agents(agents: list[Agent], stagger_s: float = 5.0, log=None) -> int:
    """Start the agents `stagger_s` apart, each running its sweeps in turn; the max exit code, 128+signal when stopped."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    supervisor = Supervisor(log)
    codes: list[int] = []

    def slot(k: int) -> None:
        agent = agents[k]
        if not supervisor.sleep(k * stagger_s):  # agents asking the server at the same instant get the same run
            return
        for command in agent.commands:
            proc = supervisor.start(list(command), agent_env(os.environ, agent.env))
            if proc is None:
                return
            pinned = [f"{key}={value}" for key, value in agent.env.items()]
            log(f"[agent {k}] " + " ".join([*pinned, shlex.join(command)]))
            codes.append(supervisor.wait(proc))

    supervisor.run(len(agents), slot)
    return supervisor.exit_code(max(codes, default=0))

"""W&B backend: create the sweep(s) on the server and run `wandb agent` processes, one per GPU group.

Each agent gets its own CUDA_VISIBLE_DEVICES group, split as the local backend splits its slots;
the GPU profiles set trainer.devices=auto, so every trial uses all GPUs of its agent's group (DDP
when more than one). The agents are started and stopped by the local backend's supervisor. An 8-GPU node
runs 8 agents of 1 GPU (default), 4 agents of 2 (`--gpus-per-agent 2`) or 1 agent of 8.
When an ablation needs several grid sweeps, each agent works through them in order.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from vit_lightning.bookkeeping import wandb_credentials
from vit_lightning.sweep.supervise import Supervisor, slot_envs
from vit_lightning.sweep.validate import SweepError


@dataclass(frozen=True)
class Agent:
    """One agent slot: the `wandb agent` commands it runs one after another, and its environment overlay."""

    commands: tuple[tuple[str, ...], ...]
    env: dict[str, str]

    def shell(self) -> str:
        """A copy-pasteable line (e.g. for an sbatch script)."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        body = "; ".join(shlex.join(c) for c in self.commands)  # each sweep in turn, whatever the last one did
        return f"{prefix} {body}".strip() if len(self.commands) == 1 else f"{prefix} sh -c {shlex.quote(body)}".strip()


def has_credentials(env: dict | None = None, netrc_path: str | Path | None = None) -> bool:
    """True when W&B is on and can log in without asking (WANDB_API_KEY, or a netrc entry for its host)."""
    env = os.environ if env is None else env
    if env.get("WANDB_MODE") in ("disabled", "offline", "dryrun"):
        return False
    return wandb_credentials(env, netrc_path)


def agent_commands(sweep_paths: list[str], groups: list[list[str]], count: int | None = None,
                   wandb_cmd: tuple[str, ...] = ("wandb",), forward_signals: bool = True) -> list[Agent]:
    """The agents to start: each runs `wandb agent [--count N] ENTITY/PROJECT/ID` for every sweep, pinned to its group."""
    # --forward-signals: the agent relays our SIGINT/SIGTERM to its run (which sits in its own process group)
    extra = (("--forward-signals",) if forward_signals else ()) + (("--count", str(count)) if count else ())
    commands = tuple((*wandb_cmd, "agent", *extra, path) for path in sweep_paths)
    return [Agent(commands, env) for env in slot_envs(groups)]


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


def create_sweeps(configs: list[dict], project: str, entity: str | None) -> list[str]:
    """Create each sweep on the W&B server; return their ENTITY/PROJECT/ID paths."""
    import wandb

    paths = []
    for config in configs:
        sweep_id = wandb.sweep(config, project=project, entity=entity)
        paths.append("/".join(p for p in (entity, project, sweep_id) if p))
    return paths


def agent_forwards_signals() -> bool:
    """Whether this wandb's `wandb agent` has --forward-signals (newer releases only)."""
    try:
        from wandb.cli.cli import agent
    except ImportError:
        return False
    return any(p.name == "forward_signals" for p in agent.params)


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
            proc = supervisor.start(list(command), {**os.environ, **agent.env})
            if proc is None:
                return
            log(f"[agent {k}] {agent.shell() if len(agent.commands) == 1 else shlex.join(command)}")
            codes.append(supervisor.wait(proc))

    supervisor.run(len(agents), slot)
    return supervisor.exit_code(max(codes, default=0))

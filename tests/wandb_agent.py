"""Test helpers: launch a trial exactly as `wandb agent` does, and read back what it logged offline.

The command and its environment follow wandb/wandb_agent.py (Agent._command_run, AgentProcess): the
sweep command from wandb's own helpers, `${env}` as /usr/bin/env, `${interpreter}` as `python`,
WANDB_SWEEP_ID / WANDB_RUN_ID / WANDB_SWEEP_PARAM_PATH (with the param file written by wandb's
config_util), WANDB_DIR set to the working directory, a process group of its own and a closed stdin.
An offline run file is wandb's transaction log: leveldb-log blocks of protobuf `Record`s.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb
from wandb.sdk.launch.sweeps import utils as sweep_utils
from wandb.sdk.lib import config_util

BLOCK = 32768  # leveldb log block; every record chunk has a 7-byte header (crc32, length, type)
FULL, LAST = 1, 4


def agent_command(sweep: dict, run_id: str, params: dict[str, Any]) -> tuple[list[str], dict]:
    """The trial's command line as the agent renders it, and the agent's `command` message for it."""
    command = {"type": "run", "run_id": run_id, "program": sweep.get("program"),
               "args": {key: {"value": value} for key, value in params.items()}}
    template = sweep_utils.create_sweep_command(list(sweep.get("command") or []))
    macros = sweep_utils.create_sweep_command_args(command)
    macros.update(interpreter=["python"], program=[command["program"]], env=["/usr/bin/env"])
    argv: list[str] = []
    for chunk in map(str, template):
        argv += (macros.get(chunk[2:-1]) or []) if chunk.startswith("${") and chunk.endswith("}") else [chunk]
    return argv, command


def agent_environ(agent_env: dict[str, str], cwd: Path, sweep_id: str, command: dict,
                  entity: str = "me", project: str = "vit") -> dict[str, str]:
    """The environment a trial gets from an agent running with `agent_env` in `cwd`; writes its param file."""
    env = dict(agent_env)
    env.setdefault("WANDB_DIR", str(cwd))  # Agent.__init__
    env.update(WANDB_ENTITY=entity, WANDB_PROJECT=project, WANDB_SWEEP_ID=sweep_id)  # run_agent
    param_path = Path(env["WANDB_DIR"]) / "wandb" / f"sweep-{sweep_id}" / f"config-{command['run_id']}.yaml"
    config_util.save_config_file_from_dict(str(param_path), command["args"])
    env.update(WANDB_RUN_ID=command["run_id"], WANDB_SWEEP_PARAM_PATH=str(param_path))
    env.pop("WANDB_SERVICE", None)
    return env


def launch(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    """Start the trial as AgentProcess does: own process group, a stdin closed at once."""
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                **group)
    proc.stdin.close()
    return proc


# ---- reading offline runs ----------------------------------------------------------------------------

def records(path: Path) -> list[pb.Record]:
    """Every protobuf Record of a `run-*.wandb` file, in order."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, pos, chunk = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(chunk)
            out.append(record)
            chunk = b""
    return out


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def _value(item) -> Any:
    if item.value_json:
        return json.loads(item.value_json)
    kind = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None  # typed history values
    return getattr(item, kind) if kind else None


@dataclass
class OfflineRun:
    """What the W&B server would have received from one offline run file."""

    run: pb.RunRecord
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    preempting: bool = False


def read_run(path: Path) -> OfflineRun:
    """Replay one offline run file: its run record, config and summary updates, history rows and exit."""
    parsed: OfflineRun | None = None
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":  # its config holds what the run started with: under an agent, the sweep's parameters
            parsed = parsed or OfflineRun(record.run)
            parsed.run = record.run
            parsed.config.update({_key(item): _value(item) for item in record.run.config.update})
        if parsed is None:
            continue
        if kind == "config":
            parsed.config.update({_key(item): _value(item) for item in record.config.update})
        elif kind == "summary":
            parsed.summary.update({_key(item): _value(item) for item in record.summary.update})
            for item in record.summary.remove:
                parsed.summary.pop(_key(item), None)
        elif kind == "history":
            parsed.history.append({_key(item): _value(item) for item in record.history.item})
        elif kind == "exit":
            parsed.exit_code = record.exit.exit_code
        elif kind == "preempting":
            parsed.preempting = True
    assert parsed is not None, f"{path} holds no run record"
    return parsed


def offline_runs(root: Path) -> list[Path]:
    """Every offline run file under root that holds a run (a wandb-core killed by SIGTERM leaves one empty)."""
    files = sorted(Path(root).rglob("offline-run-*/run-*.wandb"))
    return [f for f in files if any(r.WhichOneof("record_type") == "run" for r in records(f))]


def stop_service(pid: int, timeout: float = 30) -> None:
    """SIGTERM the wandb-core under process pid and wait until it has exited, as when SLURM signals it first."""
    core = [d for d in _descendants(pid) if "wandb-core" in _cmdline(d)]
    assert core, "no wandb-core under the trial"
    for d in core:
        os.kill(d, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any("wandb-core" in _cmdline(d) for d in core):
        time.sleep(0.05)
    assert not any("wandb-core" in _cmdline(d) for d in core), f"wandb-core still running {timeout:.0f} s after SIGTERM"


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [d for child in map(int, out) for d in (child, *_descendants(child))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


# ---- a W&B public API made of offline runs -----------------------------------------------------------

class FakeRun:
    """A wandb.apis.public.Run with exactly what an offline run recorded (several attempts of one run id merged)."""

    def __init__(self, attempts: list[OfflineRun]):
        first, last = attempts[0], attempts[-1]
        self.id, self.name, self.project = last.run.run_id, last.run.display_name, last.run.project
        self.tags, self.sweep_name = list(last.run.tags), last.run.sweep_id or None
        self.config = {k: v for a in attempts for k, v in a.config.items()}
        self.summary_metrics = {k: v for a in attempts for k, v in a.summary.items()}
        self._history = [row for a in attempts for row in a.history]
        self.state = ("finished" if last.exit_code == 0 else "preempted" if last.preempting
                      else "failed" if last.exit_code is not None else "running")
        self.created_at = _iso(first.run.start_time.seconds)
        self.heartbeat_at = _iso(last.run.start_time.seconds + int(last.summary.get("_runtime") or 0))

    def scan_history(self):
        return iter(self._history)


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


class FakeApi:
    """wandb.Api() over offline runs: sweep(ENTITY/PROJECT/ID).runs and runs(ENTITY/PROJECT, filters on tags)."""

    def __init__(self, runs: list[OfflineRun]):
        by_id: dict[str, list[OfflineRun]] = {}
        for run in runs:
            by_id.setdefault(run.run.run_id, []).append(run)
        self.all = [FakeRun(attempts) for attempts in by_id.values()]
        self.asked: list[str] = []

    def sweep(self, path: str):
        self.asked.append(path)
        sweep_id = path.rsplit("/", 1)[1]
        return type("Sweep", (), {"runs": [r for r in self.all if r.sweep_name == sweep_id]})()

    def runs(self, path: str, filters: dict | None = None):
        self.asked.append(path)
        wanted = set((filters or {}).get("tags", {}).get("$in", []))
        return [r for r in self.all if not wanted or wanted & set(r.tags)]

"""A real one-node SLURM cluster for the `slurm` tests: munged, slurmctld and slurmd, all configured under a temp dir.

Needs root and the Debian packages slurm-wlm and munge (`.ci/run` installs them when missing). Jobs run
as root on this machine; clients reach the cluster through SLURM_CONF, which `env()` sets. No accounting
database: a job's state comes from `scontrol show job` (kept MinJobAge seconds) and from the job
completion log (`completions()`: one line each time a job ends, also when it is requeued).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE"}


def unavailable() -> str | None:
    """Why this machine cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "the SLURM tests start slurmd, which needs root"
    missing = [name for name in DAEMONS + ("sbatch", "scontrol") if not shutil.which(name) and
               not Path("/usr/sbin", name).exists()]
    if missing:
        return f"SLURM is not installed (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
    """One node (this machine, `cpus` CPUs) in one partition `debug`; start() brings it up, stop() down."""

    def __init__(self, root: Path, cpus: int = 4):
        self.root, self.cpus = Path(root), cpus
        self.conf = self.root / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]
        self.pids: dict[str, Path] = {}

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment pointed at the cluster (SLURM_CONF), without an outer job's variables."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        return {**base, "SLURM_CONF": str(self.conf), **extra}

    def start(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log", "munge"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = r / "munge" / "munge.sock"
        self._daemon("munged", [_sbin("munged"), "--force", f"--key-file={key}", f"--socket={self.socket}",
                                f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
                                f"--seed-file={r / 'munge' / 'seed'}"], r / "munge" / "munged.pid")
        self.conf.write_text(self._config())
        self._daemon("slurmctld", [_sbin("slurmctld"), "-f", str(self.conf), "-i"], r / "slurmctld.pid")
        self._daemon("slurmd", [_sbin("slurmd"), "-f", str(self.conf)], r / "slurmd.pid")
        self._wait_idle()

    def _config(self) -> str:
        r = self.root
        return "\n".join([
            "ClusterName=vittest", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.socket},cred_expire=10",  # a requeued job may start again 10 s after (default 120)
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={r / 'log' / 'jobcomp.txt'}",
            "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "ReturnToService=2", "JobRequeue=1", "MinJobAge=3600", "KillWait=10", "InactiveLimit=0",
            "SlurmdParameters=config_overrides", "MpiDefault=none", "LaunchParameters=use_interactive_step",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=8000 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
            "",
        ])

    def _daemon(self, name: str, argv: list[str], pid_file: Path) -> None:
        """Start a daemon that forks into the background; wait until it has written its pid file."""
        subprocess.run(argv, check=True, capture_output=True, env=self.env(), timeout=30)
        deadline = time.monotonic() + 20
        while not (pid_file.is_file() and pid_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {self.root / 'log'}")
            time.sleep(0.1)
        self.pids[name] = pid_file

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-o", "%t", check=False).stdout.strip()
            if out.startswith("idle"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"node not idle after {timeout:.0f}s (sinfo: {out!r}); see {self.root / 'log'}")

    def stop(self) -> None:
        """Cancel what is left, then end the daemons this cluster started (each by its pid)."""
        self.run("scancel", "--full", "-u", "root", check=False)
        time.sleep(0.5)
        for name in reversed(DAEMONS):
            pid_file = self.pids.get(name)
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (AttributeError, OSError, ValueError):
                pass
        time.sleep(0.5)

    # --- clients --------------------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, check=check, env=kwargs.pop("env", self.env()),
                              timeout=kwargs.pop("timeout", 60), **kwargs)

    def sbatch(self, script: Path, *options: str, env: dict | None = None) -> str:
        """Submit a batch script; the job id."""
        out = self.run("sbatch", "--parsable", *options, str(script), env=env or self.env(),
                       cwd=str(Path(script).parent)).stdout
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, Restarts, ...); {} once it is forgotten."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out.splitlines()[0])) if out.strip() else {}

    def wait(self, job_id: str, timeout: float, until=None) -> dict[str, str]:
        """Wait until the job is in a final state (or `until(job)` holds); its last `scontrol` view."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if (until(job) if until else job.get("JobState") in FINAL_STATES):
                return job
            time.sleep(1)
        raise TimeoutError(f"job {job_id} still {self.job(job_id).get('JobState')} after {timeout:.0f}s")

    def completions(self, job_id: str) -> list[dict[str, str]]:
        """Every end the job completion log holds for this job (a requeued job ends more than once)."""
        path = self.root / "log" / "jobcomp.txt"
        lines = path.read_text().splitlines() if path.is_file() else []
        rows = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines]
        return [row for row in rows if row.get("JobId") == job_id]

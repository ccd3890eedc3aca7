"""Test configuration: W&B never talks to a server, nothing uses more threads than CI has, shared fixtures."""

import os
import signal

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

# The test processes (`pytest -n 2`) share the cores: each computes on its share, and so do the fits it starts. An
# oversubscribed torch spins instead of waiting (on 2 cores, a third busy thread beside the suite took it from 7.3 to
# 18.6 minutes).
_THREADS = max(1, min(2, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))

import torch  # noqa: E402

torch.set_num_threads(_THREADS)

# A shell starts a background job with SIGINT ignored, and Python then installs no KeyboardInterrupt handler, in
# this process or in the fits the tests start: Ctrl-C tests would see a run that ignores SIGINT. Give them a terminal's.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


import contextlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402
from tiny import TINY_MODEL  # noqa: E402  (tests/tiny.py: the smallest ViT that trains)


@contextlib.contextmanager
def _tmpfs(path, options: str):
    """A tmpfs mounted at path for the with-block; yields False where this machine cannot mount one."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def readonly_dir(tmp_path):
    """A directory nobody may write into: a read-only tmpfs, or (not root) one without write permission."""
    path = tmp_path / "readonly"
    with _tmpfs(path, "ro,size=64k") as mounted:
        if not mounted:
            if os.geteuid() == 0:
                pytest.skip("root cannot make a read-only directory without mounting one")
            path.chmod(0o555)
        yield path
        if not mounted:
            path.chmod(0o755)


@pytest.fixture
def small_disk(tmp_path):
    """(directory, mounted): a 200 KiB tmpfs with 80 KiB free, or a plain directory (mounted False) where
    this machine cannot mount one; the test then simulates the full disk."""
    path = tmp_path / "small"
    with _tmpfs(path, "size=200k") as mounted:
        if mounted:
            (path / "filler").write_bytes(bytes(120 * 1024))
        yield path, mounted


@pytest.fixture
def conv(tmp_path, monkeypatch):
    """The convolutional test family (tests/conv_family.py), registered as one outside the tree is: its distribution
    (entry point included) on sys.path and on the PYTHONPATH of the processes the test starts, found by
    importlib.metadata; dropped after the test."""
    import conv_family

    from vit_lightning.commands.sweep import validate
    from vit_lightning.model.family import FAMILIES, discover, unregister

    site = conv_family.install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    here = os.path.dirname(os.path.abspath(__file__))  # conv_family's folder
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), here, os.environ.get("PYTHONPATH", "")]))
    assert discover() == [conv_family.NAME]  # what the registry's first read does in a fresh process
    validate.fit_parser.cache_clear()  # it lists every family's options
    yield FAMILIES[conv_family.NAME]
    unregister(conv_family.NAME)
    validate.fit_parser.cache_clear()


@pytest.fixture
def tiny_fit():
    """tiny_fit(train_batches, val_batches, *more): fit's argv for the tiny model on that many batches per epoch."""
    def argv(train_batches: int = 2, val_batches: int = 1, *more: str) -> list[str]:
        return [*TINY_MODEL, f"--trainer.limit_train_batches={train_batches}",
                f"--trainer.limit_val_batches={val_batches}", *more]
    return argv


@pytest.fixture
def only_record():
    """only_record(root): (path, record) of the one run record under a run root; fails if there is not exactly one."""
    def read(root):
        paths = sorted(root.glob("*/*/*/results.json"))
        assert len(paths) == 1, f"expected one run record under {root}, found {[str(p) for p in paths]}"
        return paths[0], json.loads(paths[0].read_text())
    return read


# ---- a stand-in for `vit-ablate fit` (no torch) for the local sweep backend's tests --------------------
STAND_IN_FIT = r'''
import json, math, os, pathlib, signal, sys, time
import yaml
cfg = {k: yaml.safe_load(v) for k, v in (a[2:].split("=", 1) for a in sys.argv[1:])}
name = cfg["run.trial"]  # as fit does: the id the runner hands it names the run dir and goes into the record
run = pathlib.Path(cfg["run.root"]) / cfg["run.ablation"] / cfg["run.profile"] / name
run.mkdir(parents=True, exist_ok=True)
marker = pathlib.Path(os.environ["FAKE_MARKER"])
note = lambda text: marker.open("a").write(f"{text} {name}\n")
note("start")
record = run / "results.json"
if record.exists() and json.loads(record.read_text())["status"] == "completed":
    sys.exit(0)
def stop(signum, frame):
    note(f"signal{signum}")
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
gate = os.environ.get("FAKE_GATE")  # hold here until the test opens the gate (creates the file)
while gate and not os.path.exists(gate):
    time.sleep(0.05)
failed = cfg.get("model.lr") == 0.5 and not os.environ.get("FAKE_FIXED")
metrics = {"val/acc_best": 1 - abs(math.log10(cfg["model.lr"]) + 2.5)}  # a known function: best at lr 10^-2.5
record.write_text(json.dumps({"status": "failed" if failed else "completed", "config": cfg, "trial": name,
                              "error": "ValueError: boom" if failed else None, "started_at": "t", "metrics": metrics}))
note("end")
sys.exit(1 if failed else 0)
'''



class StandIn:
    """A sweep of the stand-in fit under tmp_path: each trial notes start/signal/end in marker.txt and writes a
    record; lr 0.5 fails unless FAKE_FIXED is set (FAKE_SLEEP, FAKE_GATE hold it)."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.marker = tmp_path / "marker.txt"

    def sweep(self, lrs=(0.1, 0.2)) -> str:
        """The sweep YAML's path: lrs x (cls, gap), seed 0, run root tmp_path/runs, ablation fake."""
        import yaml

        fake = self.tmp_path / "fake_fit.py"
        fake.write_text(STAND_IN_FIT)
        config = {
            "method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"}, "program": str(fake),
            "command": ["${env}", "${interpreter}", "${program}", "${args}"],
            "parameters": {"model.lr": {"values": list(lrs)}, "model.pooling": {"values": ["cls", "gap"]},
                           "run.root": {"value": str(self.tmp_path / "runs")}, "run.ablation": {"value": "fake"},
                           "run.profile": {"value": "demo"}, "seed_everything": {"value": 0}},
        }
        path = self.tmp_path / "fake.yaml"
        path.write_text(yaml.safe_dump(config))
        return str(path)

    def events(self) -> list[str]:
        """The trials' notes so far, oldest first ("start NAME", "signal15 NAME", "end NAME")."""
        return self.marker.read_text().split("\n")[:-1] if self.marker.exists() else []

    def state(self) -> dict:
        """The local backend's state file: trial id -> its status, attempts, pid, error."""
        from vit_lightning.commands.sweep import local

        return json.loads((self.tmp_path / "runs" / "fake" / "demo" / local.STATE).read_text())["trials"]


@pytest.fixture
def stand_in(tmp_path):
    """A StandIn under this test's tmp_path."""
    return StandIn(tmp_path)


class FakeWandbServer:
    """wandb.sweep and wandb.Api() for sweeps: created sweeps (their configs as YAML reads them back) are listed by
    the project afterwards."""

    def __init__(self):
        self.sweeps, self.default_entity = [], "me"

    def sweep(self, config, project=None, entity=None):
        import yaml

        sweep_id = f"id{len(self.sweeps) + 1}"
        self.sweeps.append(type("Sweep", (), {"id": sweep_id, "config": yaml.safe_load(yaml.safe_dump(config))})())
        return sweep_id

    def project(self, name, entity=None):
        return type("Project", (), {"sweeps": lambda _: list(self.sweeps)})()


@pytest.fixture
def wandb_server(monkeypatch):
    """A fake W&B server behind wandb.sweep and wandb.Api, credentials present, WANDB_MODE unset (the tests' own
    "disabled" would stop the backend first), on a login node without a GPU."""
    from vit_lightning.commands.sweep import wandb_backend

    server = FakeWandbServer()
    monkeypatch.setattr("wandb.sweep", server.sweep)
    monkeypatch.setattr("wandb.Api", lambda: server)
    monkeypatch.setattr(wandb_backend, "has_credentials", lambda: True)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return server


# ---- markers that mean what they say ------------------------------------------------------------------------
# A test that trains carries `slow`, and one that trains with two DDP processes `ddp` too: `pytest -m "not slow"`
# is then the quick loop. Training is seen where it starts: Lightning's Trainer.fit in this process, or a process
# this one starts that runs a training command (vit-ablate fit, sweep, gpu-check, or the sweep's trial worker). A
# test with the `stand_in` fixture sweeps the stand-in fit, which trains nothing: its sweeps do not count.
TRAINING_COMMAND = re.compile(r"(?:vit-ablate|vit_lightning\.cli)\s+(fit|sweep|gpu-check)\b|vit_lightning\.sweep\.forkserver\b")
NOT_TRAINING = ("--help", "-h", "--dry-run", "--print-sbatch")
TWO_PROCESSES = re.compile(r"--trainer\.devices[= ]2\b")


def _command(args) -> str:
    """A Popen command as one line of text (a shell string as it is)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        return os.fsdecode(args)
    return " ".join(os.fsdecode(a) for a in args)


def _trains(command: str, sweeps_train: bool = True) -> tuple[bool, bool]:
    """(trains, with two DDP processes) for a command line."""
    found = TRAINING_COMMAND.search(command)
    trains = bool(found) and not set(command.split()) & set(NOT_TRAINING) and (sweeps_train or found[1] != "sweep")
    return trains, trains and bool(TWO_PROCESSES.search(command))


class _Watch:
    """Notes whether the test trains (in this process or a process it starts) and with how many DDP processes."""

    def __init__(self, sweeps_train: bool):
        self.trained = self.ddp = False
        self.sweeps_train = sweeps_train

    @contextlib.contextmanager
    def __call__(self):
        import lightning.pytorch as pl

        fit, popen = pl.Trainer.fit, subprocess.Popen.__init__
        watch = self

        def watched_fit(trainer, *args, **kwargs):
            watch.trained = True
            watch.ddp |= trainer.world_size > 1
            return fit(trainer, *args, **kwargs)

        def watched_popen(proc, args, *more, **kwargs):
            trains, ddp = _trains(_command(args), watch.sweeps_train)
            watch.trained |= trains
            watch.ddp |= ddp
            return popen(proc, args, *more, **kwargs)

        pl.Trainer.fit, subprocess.Popen.__init__ = watched_fit, watched_popen
        try:
            yield self
        finally:
            pl.Trainer.fit, subprocess.Popen.__init__ = fit, popen


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    item.watch = _Watch(sweeps_train="stand_in" not in getattr(item, "fixturenames", ()))
    with item.watch():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with item.watch():
        result = yield
    marks = {mark.name for mark in item.iter_markers()}
    if item.watch.trained and "slow" not in marks:
        pytest.fail("this test trains (fit, or a training command in a subprocess): mark it @pytest.mark.slow",
                    pytrace=False)
    if item.watch.ddp and "ddp" not in marks:
        pytest.fail("this test trains with two DDP processes: mark it @pytest.mark.ddp", pytrace=False)
    return result


def pytest_collection_modifyitems(items):
    """A slurm test trains on the cluster it starts: it is slow too, so `-m "not slow"` leaves it out."""
    for item in items:
        if item.get_closest_marker("slurm") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)

"""What a trial asks of the machine (its accelerator, devices, loader workers, data) is checked before anything
starts: a sweep or fit that cannot run here is one line, with no run dir and no sweep state written; W&B agents
started here are checked before any sweep is created; a job script is printed anywhere, and checked on its node."""

from __future__ import annotations

import shlex

import pytest
import yaml
from tiny import TINY_MODEL

from vit_lightning.commands.fit import main as train
from vit_lightning.commands.sweep import cli, wandb_backend, yamls
from vit_lightning.data import sources
from vit_lightning.run import machine

TINY = {"model.width": {"value": 32}, "model.depth": {"value": 1}, "model.heads": {"value": 2},
        "model.mlp_dim": {"value": 64}, "trainer.max_epochs": {"value": 1}}


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(machine, "gpus_here", lambda: 0)
    monkeypatch.setattr("lightning.pytorch.accelerators.MPSAccelerator.is_available", staticmethod(lambda: False))


@pytest.fixture
def offline(monkeypatch):
    """No server answers: the check must not download, and must say how to provide the data."""
    asked = []
    monkeypatch.setattr(sources, "reachable", lambda url, timeout=5.0: asked.append(url) or False)
    return asked


def sweep_file(tmp_path, **params) -> str:
    config = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"}, "command": yamls.COMMAND,
              "parameters": {**TINY, "run.root": {"value": str(tmp_path / "runs")},
                             "seed_everything": {"values": [0, 1, 2]},
                             **{key: {"value": value} for key, value in params.items()}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def refused(argv, capsys) -> str:
    """The sweep's one line, after checking it exits 2 with nothing else printed."""
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert not out.out and len(lines) == 1, out
    return lines[0]


def test_a_gpu_sweep_on_a_machine_without_one_is_one_line_and_writes_nothing(tmp_path, no_gpu, capsys):
    line = refused([sweep_file(tmp_path, **{"trainer.accelerator": "gpu"}), "--backend", "local"], capsys)
    assert line == ("vit-ablate sweep: error: 3 of 3 trials cannot run on this machine: trainer.accelerator=gpu "
                    "needs a GPU and this machine has none (torch sees no CUDA device): set trainer.accelerator=cpu "
                    "to train on the CPU, or run it where a GPU is")
    assert not (tmp_path / "runs").exists()  # no state file, no run dir


def test_the_committed_gpu_profile_is_refused_before_its_first_trial(tmp_path, no_gpu, capsys):
    argv = ["pos_encoding", "--profile", "cifar10", "--backend", "local", "--set", f"run.root={tmp_path / 'runs'}"]
    line = refused(argv, capsys)
    assert line.startswith("vit-ablate sweep: error: 54 of 54 trials cannot run on this machine: trainer.accelerator=gpu")
    assert not (tmp_path / "runs").exists()


def test_data_neither_here_nor_downloadable_names_the_data_and_where_to_put_it(tmp_path, offline, capsys):
    root = tmp_path / "data"
    argv = [sweep_file(tmp_path, **{"trainer.accelerator": "cpu", "data.name": "cifar10", "data.download": True,
                                    "data.root": str(root), "model.patch_size": 4}), "--backend", "local"]
    line = refused(argv, capsys)
    assert (f"cifar10 data is not in {root / 'cifar-10-batches-py'} and www.cs.toronto.edu cannot be reached to "
            f"download it: put cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, "
            f"extracted, in {root} (data.root)") in line
    assert offline == ["https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"]  # asked once for 3 trials
    assert not (tmp_path / "runs").exists() and not root.exists()  # nothing downloaded, no folder made


def test_data_present_or_reachable_passes_the_check(tmp_path, monkeypatch):
    root = tmp_path / "data"
    options = {"data.name": "cifar10", "data.download": True, "data.root": str(root)}
    monkeypatch.setattr(sources, "reachable", lambda url, timeout=5.0: True)
    assert machine.problem(options) is None  # the trial will download it
    monkeypatch.setattr(sources, "reachable", lambda url, timeout=5.0: pytest.fail("files present: no server asked"))
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [*(f"data_batch_{k}" for k in range(1, 6)), "test_batch", "batches.meta"]:
        (folder / name).write_bytes(b"")
    assert machine.problem(options) is None


def test_devices_and_workers_beyond_the_machine_are_refused(monkeypatch):
    monkeypatch.setattr(machine, "gpus_here", lambda: 2)
    gpu = {"trainer.accelerator": "gpu"}
    assert machine.problem({**gpu, "trainer.devices": 2}) is None and machine.problem({**gpu, "trainer.devices": "auto"}) is None
    assert machine.problem({**gpu, "trainer.devices": 4}) == ("trainer.devices=4 asks for 4 GPUs; a trial sees 2 here: "
                                                              "set trainer.devices to at most 2 (or auto)")
    assert "asks for 4 GPUs" in machine.problem({**gpu, "trainer.devices": [0, 3]})
    assert "a trial sees 1 here" in machine.problem({**gpu, "trainer.devices": 2}, gpus=1)  # a sweep slot's group
    assert machine.problem({"data.num_workers": 4}, cpus=4) is None
    assert machine.problem({"data.num_workers": 5}, cpus=4) == ("data.num_workers=5 loader processes is more than the "
                                                                "4 CPU(s) here: set data.num_workers to at most 3")


def test_a_fit_that_cannot_run_here_is_one_line_before_its_run_dir(tmp_path, no_gpu, offline, capsys):
    base = [*TINY_MODEL, "--trainer.max_epochs=1", "--run.wandb=off", f"--run.root={tmp_path / 'runs'}"]
    gpu = [arg for arg in base if not arg.startswith("--trainer.accelerator")] + ["--trainer.accelerator=gpu"]
    cifar = [*base, "--data.name=cifar10", "--data.download=true", f"--data.root={tmp_path / 'data'}",
             "--model.patch_size=4"]
    for argv, words in ((gpu, "trainer.accelerator=gpu needs a GPU"), (cifar, "cifar10 data is not in")):
        assert train.main(argv) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("vit-ablate fit: error: ") and words in line, line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


GPU_LINE = "vit-ablate sweep: error: 54 of 54 trials cannot run on this machine: trainer.accelerator=gpu needs a GPU"


@pytest.mark.parametrize("mode", [None, "offline", "disabled"])
def test_wandb_agents_on_a_machine_without_a_gpu_are_refused_before_any_sweep_exists(mode, tmp_path, wandb_server,
                                                                                   no_gpu, monkeypatch, capsys):
    """Credentials present (or WANDB_MODE offline/disabled): the agents would train here, so this machine is checked
    first, as the local backend checks it; no sweep is created and no agent starts."""
    if mode:
        monkeypatch.setenv("WANDB_MODE", mode)
    monkeypatch.setattr(wandb_backend, "run_agents", lambda *a, **k: pytest.fail("an agent started"))
    argv = ["pos_encoding", "--profile", "cifar10", "--backend", "wandb", "--set", f"run.root={tmp_path / 'runs'}"]
    assert refused(argv, capsys).startswith(GPU_LINE)
    assert wandb_server.sweeps == [] and not (tmp_path / "runs").exists()


def test_a_random_sweep_for_wandb_agents_is_checked_by_its_first_values(tmp_path, wandb_server, no_gpu, capsys):
    path = sweep_file(tmp_path, **{"trainer.accelerator": "gpu"})
    config = yaml.safe_load(open(path))
    config["method"] = "random"
    config["parameters"]["model.lr"] = {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-2}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(config))
    line = refused([path, "--backend", "wandb"], capsys)
    assert "cannot run on this machine: trainer.accelerator=gpu needs a GPU" in line and wandb_server.sweeps == []


@pytest.mark.parametrize("backend", ["local", "wandb"])
def test_a_job_script_prints_on_a_machine_without_a_gpu_and_its_node_checks_the_trials(backend, tmp_path, wandb_server,
                                                                                     no_gpu, capsys):
    """--print-sbatch: the trials run on the job's node, so this machine's lack of a GPU refuses nothing; the job's
    own command checks them where it starts (here a node without a GPU: one line, nothing written)."""
    argv = ["pos_encoding", "--profile", "cifar10", "--backend", backend, "--print-sbatch",
            "--set", f"run.root={tmp_path / 'runs'}"]
    assert cli.main(argv) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --gpus-per-node=1" in script
    [command] = [shlex.split(line[:-2]) for line in script.splitlines() if " sweep " in line and line.endswith("&")]
    assert "--print-sbatch" not in command and command[command.index("--backend") + 1] == backend
    created = len(wandb_server.sweeps)  # wandb: the sweeps the job joins, created now
    assert refused(command[command.index("sweep") + 1:], capsys).startswith(GPU_LINE)
    assert len(wandb_server.sweeps) == created and not (tmp_path / "runs").exists()

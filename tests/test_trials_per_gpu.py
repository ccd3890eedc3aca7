"""Several trials per GPU (--trials-per-gpu): the slot layout, the loader shares, job scripts, W&B agents, a sweep."""

from __future__ import annotations

import collections
import os
import shlex

import pytest
import yaml
from conftest import STAND_IN_FIT

from vit_lightning.commands.sweep import cli, wandb_backend
from vit_lightning.commands.sweep.supervise import loader_share, slot_envs, split_gpus
from vit_lightning.core.names import WORKERS_ENV
from vit_lightning.run import machine


def run_cli(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("gpus,per_gpu,cpus", [(2, 3, 16), (8, 3, 64), (1, 4, 16), (4, 2, 8)])
def test_each_slot_is_pinned_to_one_gpu_and_gets_its_share_of_the_cpus(gpus, per_gpu, cpus):
    envs = slot_envs(split_gpus([str(g) for g in range(gpus)]), cpus=cpus, per_group=per_gpu)
    assert len(envs) == gpus * per_gpu
    per_device = collections.Counter(env["CUDA_VISIBLE_DEVICES"] for env in envs)
    assert per_device == {str(g): per_gpu for g in range(gpus)}  # every GPU carries N trials, each trial one GPU
    # the first slots (the sweep's last trials too) fall on different GPUs
    assert {env["CUDA_VISIBLE_DEVICES"] for env in envs[:gpus]} == {str(g) for g in range(gpus)}
    [share] = {int(env[WORKERS_ENV]) for env in envs}
    slots = gpus * per_gpu
    # the largest equal share whose workers and trial processes fit the CPUs (at least one worker each)
    best = max([w for w in range(1, cpus + 1) if slots * (w + 1) <= cpus], default=1)
    assert share == best


def test_a_group_of_several_gpus_counts_each_of_its_ddp_processes():
    envs = slot_envs([["0", "1"], ["2", "3"]], cpus=40, per_group=2)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0,1", "2,3", "0,1", "2,3"]
    assert {env[WORKERS_ENV] for env in envs} == {"4"}  # 8 processes: (40 - 8) / 8 workers each
    assert loader_share(4, 8) == 1  # never none
    assert slot_envs([["0"]], cpus=16) == [{"CUDA_VISIBLE_DEVICES": "0"}]  # one trial per GPU keeps data.num_workers
    cpu = slot_envs([[]], cpus=8, per_group=2)  # no GPU: the trials split the threads and the workers
    assert cpu == [{"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", WORKERS_ENV: "3"}] * 2
    with pytest.raises(ValueError, match="at least 1 trial per GPU"):
        slot_envs([["0"]], per_group=0)


def test_a_trial_uses_at_most_its_share_of_loader_workers(monkeypatch):
    from vit_lightning.data.datamodule import ImageDataModule

    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert ImageDataModule(num_workers=8).workers == 8
    monkeypatch.setenv(WORKERS_ENV, "3")
    data = ImageDataModule(num_workers=8, batch_size=16)
    assert data.workers == 3 and ImageDataModule(num_workers=2).workers == 2 and ImageDataModule().workers == 0
    data.setup("fit")
    loader = data.train_dataloader()
    assert loader.num_workers == 3
    assert data.hparams.num_workers == 8  # the recorded setting is the profile's


def test_the_dry_run_lists_the_slots(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    code, out, err = run_cli(["pos_encoding", "--profile", "cifar10", "--dry-run", "--trials-per-gpu", "3"], capsys)
    assert code == 0, err
    slots = [line for line in out.splitlines() if line.startswith("# slot")]
    cpus = len(os.sched_getaffinity(0))
    share = max(1, (cpus - 6) // 6)
    assert slots == [f"# slot {k + 1}: CUDA_VISIBLE_DEVICES={k % 2} {WORKERS_ENV}={share}" for k in range(6)]
    trials = [line for line in out.splitlines() if line.startswith("vit-ablate fit")]
    assert len(trials) == 54  # the Table 8 cifar10 profile; each trial on one GPU (no w2 in a name)
    assert not any("-w2-" in line for line in trials)
    with pytest.raises(SystemExit) as stop:
        cli.main(["pos_encoding", "--dry-run", "--trials-per-gpu", "0"])
    assert stop.value.code == 2 and "--trials-per-gpu: expected a positive integer, got '0'" in capsys.readouterr().err


def test_the_local_job_script_runs_n_trials_per_gpu_with_the_cpus_for_their_loaders(capsys):
    code, out, err = run_cli(["pos_encoding", "--profile", "cifar10", "--backend", "local", "--parallel", "2",
                              "--trials-per-gpu", "3", "--print-sbatch"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    [run] = [line for line in lines if " sweep pos_encoding " in line]
    assert run.endswith("--backend local --profile cifar10 --parallel 2 --trials-per-gpu 3 &"), run
    assert "#SBATCH --gpus-per-node=2" in lines
    [cpus] = [int(line.split("=")[1].split()[0]) for line in lines if line.startswith("#SBATCH --cpus-per-task=")]
    # the profile's 8 workers per GPU split among its 3 trials (2 each), plus one CPU per trial: 6 x 3
    assert cpus == 2 * 3 * (8 // 3 + 1) == 18
    assert loader_share(cpus, 6) == 8 // 3  # on that node each slot then gets that share
    code, out, _ = run_cli(["pos_encoding", "--profile", "cifar10", "--backend", "local", "--print-sbatch"], capsys)
    assert "--trials-per-gpu" not in out and "#SBATCH --cpus-per-task=9 " in out  # one trial per GPU: as before


def test_wandb_runs_n_agents_per_gpu_and_its_job_script_says_so(wandb_server, monkeypatch, capsys):
    argv = ["pos_encoding", "--profile", "cifar10", "--backend", "wandb", "--agents", "2", "--trials-per-gpu", "3",
            "--print-sbatch"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    [command] = [shlex.split(line[:-2]) for line in out.splitlines() if " sweep " in line and line.endswith("&")]
    assert command[command.index("--trials-per-gpu") + 1] == "3" and "#SBATCH --gpus-per-node=2" in out
    assert "#SBATCH --cpus-per-task=18 " in out
    started = []
    monkeypatch.setattr(wandb_backend, "run_agents", lambda agents, stagger: started.extend(agents) or 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    monkeypatch.setattr(machine, "problem", lambda flat, **_: None)  # the node has the GPUs, CPUs and data asked for
    assert cli.main(command[2:]) == 0  # the job's node: 3 agents on each of its 2 GPUs
    assert [a.env["CUDA_VISIBLE_DEVICES"] for a in started] == ["6", "7"] * 3
    assert {a.env[WORKERS_ENV] for a in started} == {str(loader_share(len(os.sched_getaffinity(0)), 6))}


RATE_FIT = STAND_IN_FIT.replace(
    'time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))',
    # a running trial's record after an epoch: its rate; and what its slot handed it
    'note(f"env {os.environ.get(\'CUDA_VISIBLE_DEVICES\')} {os.environ.get(\'' + WORKERS_ENV + '\')}")\n'
    'record.write_text(json.dumps({"status": "running", "trial": name, "config": cfg, '
    '"compute": {"epoch_images_per_s": 1000.0 * cfg["model.lr"] * 10}}))\n'
    'time.sleep(0.5 if cfg["model.lr"] == 0.1 else 3.0)').replace(
    '"metrics": metrics}', '"metrics": metrics, "compute": {"epoch_images_per_s": 1000.0 * cfg["model.lr"] * 10}}')


def test_a_sweep_runs_n_trials_on_one_gpu_and_shows_their_aggregate_rate(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    sweep = stand_in.sweep()
    config = yaml.safe_load(open(sweep))
    (tmp_path / "fake_fit.py").write_text(RATE_FIT)
    config["parameters"]["model.pooling"] = {"value": "cls"}  # two trials: lr 0.1 (short) and lr 0.2 (long)
    with open(sweep, "w") as f:
        yaml.safe_dump(config, f)
    assert cli.main([sweep, "--backend", "local", "--trials-per-gpu", "2"]) == 0
    err = capsys.readouterr().err
    events = stand_in.events()
    share = str(loader_share(len(os.sched_getaffinity(0)), 2))
    assert [e.rsplit(" ", 1)[0] for e in events if e.startswith("env")] == [f"env 3 {share}"] * 2
    assert [e.split()[0] for e in events if e.split()[0] in ("start", "end")][:2] == ["start", "start"]  # together
    # the short trial ends while the long one runs at 2,000 img/s: the line shows the trials running now
    assert "| 1/2 run | 1 running: 2,000 img/s |" in err, err
    assert "completed in" in err and "at 1,000 img/s" in err

"""W&B as a real agent drives it, without a server: trials launched exactly as `wandb agent` launches them
(from an unactivated venv, inside a SLURM array task), read back from wandb's offline run files; the tables
built from those runs; self-hosted login; sweeps joined rather than created twice; job scripts; interruptions.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # every test here trains or starts processes that do

pytest.importorskip("wandb")

import wandb_agent  # noqa: E402  (tests/wandb_agent.py)

from vit_lightning.ablation import load  # noqa: E402
from vit_lightning.commands.results import cli as table_cli  # noqa: E402
from vit_lightning.commands.sweep import cli, jobscript, trials, wandb_backend, yamls  # noqa: E402
from vit_lightning.commands.sweep.expand import expand  # noqa: E402
from vit_lightning.core.identity import flatten, normalize, same, world_size  # noqa: E402
from vit_lightning.model.family import trial_name as run_name  # noqa: E402
from vit_lightning.run import machine  # noqa: E402

ABLATION = '''"""A two-process CPU DDP trial, tiny, for the agent tests."""
from vit_lightning.ablation import METRIC, Ablation, profile

TINY = {"model.width": 32, "model.depth": 1, "model.heads": 2, "model.mlp_dim": 64, "data.batch_size": 16,
        "trainer.max_epochs": 2, "trainer.limit_train_batches": 2, "trainer.limit_val_batches": 1,
        "trainer.num_sanity_val_steps": 0, "trainer.enable_model_summary": False,
        "trainer.devices": 2, "trainer.strategy": "ddp", "run.fewshot_shots": [1]}
ABLATION = Ablation(name="agent_e2e", title="Agent end to end", source="tests", finding="none", metric=METRIC,
                    rows="model.pos_encoding", cols=None, reference={}, reference_note="none",
                    profiles={"demo": profile("demo", {"model.pos_encoding": ["learned_1d"]}, fixed=TINY, seeds=(0,))})
'''
# What an sbatch array task's batch script sees (one task per node: SLURM_NTASKS=1, --ntasks-per-node=1).
SLURM_ARRAY_TASK = {"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "1",
                    "SLURM_JOB_NAME": "vit-sweep", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
                    "SLURM_NNODES": "1", "SLURM_NODELIST": "node1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                    "SLURM_NODEID": "0", "SLURM_CPUS_ON_NODE": "2", "SLURM_SUBMIT_DIR": "/tmp"}
SWEEP_ID, RUN_ID = "swp0001", "run0001"


def bare_env(tmp: Path) -> dict[str, str]:
    """A batch job's environment: no venv on PATH, W&B offline, no credentials, inside a SLURM array task."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp)), "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
           "NETRC": str(tmp / "no-netrc"), **SLURM_ARRAY_TASK}
    if os.environ.get("PYTHONPATH"):  # a source checkout run without installing it
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def generated_sweep(tmp: Path) -> tuple[Path, dict]:
    """The tiny ablation and its sweep YAML, written by the generator of sweeps/."""
    ablations = tmp / "ablations"
    ablations.mkdir(exist_ok=True)
    (ablations / "agent_e2e.py").write_text(ABLATION)
    [(name, text)] = yamls.expected_files(names=["agent_e2e"], directory=ablations).items()
    (tmp / name).write_text(text)
    return ablations, yaml.safe_load(text)


def run_trial(tmp: Path, sweep: dict, params: dict, agent_env: dict, run_id: str = RUN_ID, timeout: float = 400):
    """Launch one trial as the agent would and wait for it; (exit code, log text)."""
    argv, command = wandb_agent.agent_command(sweep, run_id, params)
    env = wandb_agent.agent_environ(agent_env, tmp, SWEEP_ID, command)
    proc = wandb_agent.launch(argv, env, tmp, tmp / "trial.log")
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return code, (tmp / "trial.log").read_text()


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    """One 2-process CPU DDP trial of a generated sweep, launched as `wandb agent` launches it, offline."""
    tmp = tmp_path_factory.mktemp("agent")
    ablations, sweep = generated_sweep(tmp)
    params = expand(sweep)[0]  # the grid's first point, as the sweep controller hands it out
    agent = wandb_backend.agent_commands([f"me/vit/{SWEEP_ID}"], [[]])[0]
    code, log = run_trial(tmp, sweep, params, wandb_backend.agent_env(bare_env(tmp), agent.env))
    assert code == 0, log[-3000:]
    [path] = sorted((tmp / "runs").glob("agent_e2e/demo/*/results.json"))
    return {"tmp": tmp, "ablations": ablations, "sweep": sweep, "params": params,
            "record": json.loads(path.read_text()), "run_dir": path.parent, "log": log}


@pytest.mark.ddp  # agent_run trains its trial with two DDP processes
def test_agent_trial_logs_what_the_sweep_and_the_tables_need(agent_run):
    record, [path] = agent_run["record"], wandb_agent.offline_runs(agent_run["tmp"])
    run = wandb_agent.read_run(path)  # exactly one run, and it is the agent's
    assert (run.run.run_id, run.run.sweep_id, run.run.display_name) == (RUN_ID, SWEEP_ID, record["name"])
    assert record["status"] == "completed" and record["wandb"]["run_id"] == RUN_ID
    assert record["wandb"]["sweep_id"] == SWEEP_ID and record["compute"]["num_devices"] == 2  # DDP inside SLURM
    # the full flat config, as the record holds it; the sweep's own keys set once, by the agent (no "locked" warnings)
    assert {key: run.config.get(key) for key in record["config"]} == record["config"]
    assert "locked by" not in agent_run["log"], [line for line in agent_run["log"].splitlines() if "locked by" in line]
    # the sweep metric: in the history after every epoch (the best val/acc so far), and in the summary
    accs = [h["val/acc"] for h in record["history"]]
    logged = [row["val/acc_best"] for row in run.history if "val/acc_best" in row]
    assert logged == [max(accs[:k + 1]) for k in range(len(accs))] and len(logged) == 2
    # each with its epoch, so `table --wandb` keeps it in that epoch's history row
    assert [row.get("epoch") for row in run.history if "val/acc_best" in row] == [h["epoch"] for h in record["history"]]
    assert run.summary["val/acc_best"] == record["metrics"]["val/acc_best"] == max(accs)
    assert run.summary["val/fewshot1"] == record["metrics"]["val/fewshot1"]
    for key in ("params", "gflops_per_image", "train_images_per_s", "num_devices"):
        assert run.summary[f"compute/{key}"] == record["compute"][key]
    assert (run.summary["status"], run.summary["trial"], run.exit_code) == ("completed", record["name"], 0)


@pytest.mark.ddp  # agent_run trains its trial with two DDP processes
def test_an_agent_trial_whose_run_dir_has_finished_reports_that_record_to_its_run(agent_run, tmp_path):
    import shutil

    tmp, record = tmp_path, agent_run["record"]
    shutil.copytree(agent_run["tmp"] / "runs", tmp / "runs")  # the other tests keep their one offline run
    agent = wandb_backend.agent_commands([f"me/vit/{SWEEP_ID}"], [[]])[0]
    code, log = run_trial(tmp, agent_run["sweep"], agent_run["params"], wandb_backend.agent_env(bare_env(tmp), agent.env),
                          run_id="again1")
    assert code == 0 and "skipped, run already completed" in log, log[-2000:]
    [run] = [r for r in map(wandb_agent.read_run, wandb_agent.offline_runs(tmp)) if r.run.run_id == "again1"]
    assert run.summary["val/acc_best"] == record["metrics"]["val/acc_best"] and run.exit_code == 0
    assert [row["val/acc_best"] for row in run.history if "val/acc_best" in row] == [record["metrics"]["val/acc_best"]]
    assert run.summary["status"] == "completed" and run.summary["trial"] == record["name"]


@pytest.mark.ddp  # agent_run trains its trial with two DDP processes
def test_an_agent_trial_has_the_name_the_local_runner_gives_it(agent_run):
    """Named by its sweep parameters and its world size: the local backend finds (and resumes) the same run."""
    [trial] = trials.build([agent_run["sweep"]], gpus=0)
    assert agent_run["record"]["name"] == trial.id == agent_run["run_dir"].name
    assert "-w2-" in trial.id and trial.id == run_name(agent_run["params"], 2)


@pytest.mark.ddp  # agent_run trains its trial with two DDP processes
def test_the_agent_environment_is_what_makes_the_trial_start(agent_run, tmp_path):
    """Without the venv on PATH the command is not found; with SLURM's task layout devices=2 is one line."""
    sweep, params = agent_run["sweep"], agent_run["params"]
    code, log = run_trial(tmp_path, sweep, params, bare_env(tmp_path))
    assert code == 127 and "vit-ablate" in log
    unstripped = {**bare_env(tmp_path), "PATH": wandb_backend.agent_env(bare_env(tmp_path), {})["PATH"]}
    code, log = run_trial(tmp_path, sweep, params, unstripped)
    assert code == 2 and "error: SLURM started 1 task(s) but trainer.devices=2" in log and "Traceback" not in log


@pytest.mark.ddp  # agent_run trains its trial with two DDP processes
def test_table_from_wandb_runs_equals_the_table_from_local_records(agent_run, tmp_path, capsys):
    api = wandb_agent.FakeApi([wandb_agent.read_run(p) for p in wandb_agent.offline_runs(agent_run["tmp"])])
    runs, ablations = agent_run["tmp"] / "runs", str(agent_run["ablations"])
    local, remote = tmp_path / "local", tmp_path / "remote"
    base = ["agent_e2e", "--ablations-dir", ablations]
    assert table_cli.main([*base, "--runs", str(runs), "--out", str(local)]) == 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("wandb.Api", lambda: api)
        assert table_cli.main([*base, "--runs", str(tmp_path / "none"), "--out", str(remote),
                               "--wandb", f"me/vit/{SWEEP_ID}"]) == 0
        assert "1 run(s) read, 1 stored" in capsys.readouterr().err
        for name in ("table.md", "table.tex", "runs.csv"):
            assert (remote / name).read_text() == (local / name).read_text(), name
        assert f"**{agent_run['record']['metrics']['val/acc_best']:.4f} (n=1)**" in (local / "table.md").read_text()
        # the W&B copy of a finished run never replaces the run's own record
        before = {p.name: p.read_bytes() for p in (local / "records").iterdir()}
        assert table_cli.main([*base, "--runs", str(runs), "--out", str(local), "--wandb", "me/vit"]) == 0
        assert "1 skipped (1 the run's own record is kept)" in capsys.readouterr().err
        assert {p.name: p.read_bytes() for p in (local / "records").iterdir()} == before
        assert api.asked == [f"me/vit/{SWEEP_ID}", "me/vit"]
    assert table_cli.main([*base, "--out", str(remote), "--wandb", "nosweep"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "ENTITY/PROJECT" in err


@pytest.mark.parametrize("service_first", [False, True], ids=["agent-forwards", "slurm-signals-every-process"])
def test_sigterm_under_the_agent_marks_the_run_preempting_and_its_requeue_resumes_it(tmp_path, service_first):
    """The agent forwards SIGTERM: the trial exits 143 marked preempting; W&B requeues it with the same run id.

    service_first: SLURM signals every process of the job and wandb-core exits first, losing its buffered run
    file; the trial resends the attempt to the same run in a new service, so W&B still gets all of it.
    """
    _, sweep = generated_sweep(tmp_path)
    params = {**expand(sweep)[0], "trainer.devices": 1, "trainer.strategy": "auto", "trainer.max_epochs": 3,
              "trainer.limit_train_batches": 40, "run.fewshot_shots": []}
    agent_env = wandb_backend.agent_env(bare_env(tmp_path), {})
    argv, command = wandb_agent.agent_command(sweep, RUN_ID, params)
    env = wandb_agent.agent_environ(agent_env, tmp_path, SWEEP_ID, command)
    proc = wandb_agent.launch(argv, env, tmp_path, tmp_path / "trial.log")
    record_path = tmp_path / "runs" / "agent_e2e" / "demo" / run_name(params) / "results.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if json.loads(record_path.read_text())["history"]:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    if service_first:
        wandb_agent.stop_service(proc.pid)
    proc.send_signal(signal.SIGTERM)  # what `wandb agent --forward-signals` does with the SIGTERM it receives
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, (tmp_path / "trial.log").read_text()[-3000:]
    log = (tmp_path / "trial.log").read_text()
    assert "Traceback" not in log and "Exception ignored" not in log, log[-3000:]
    assert log.count("W&B's service process is gone") == service_first
    [first] = [wandb_agent.read_run(p) for p in wandb_agent.offline_runs(tmp_path)]
    assert first.preempting and first.exit_code != 0 and first.run.run_id == RUN_ID
    assert json.loads(record_path.read_text())["status"] == "interrupted"
    with (record_path.parent / "metrics.csv").open() as file:
        logged = {int(row["step"]) for row in csv.DictReader(file)}
    sent = {int(row["trainer/global_step"]) for row in first.history if "trainer/global_step" in row}
    assert logged and logged <= sent  # every row of the CSV log, W&B has (and the sweep metric's rows)
    assert first.config["model.lr"] > 0 and first.summary["status"] == "interrupted"
    # requeued: an agent runs the same command with the same run id
    code, log = run_trial(tmp_path, sweep, params, agent_env)
    assert code == 0, log[-3000:]
    record = json.loads(record_path.read_text())
    assert record["status"] == "completed" and record["wandb"]["run_id"] == RUN_ID
    assert [h["epoch"] for h in record["history"]] == [0, 1, 2]  # resumed from last.ckpt, nothing trained twice
    attempts = [wandb_agent.read_run(p) for p in wandb_agent.offline_runs(tmp_path)]
    assert [a.run.run_id for a in attempts] == [RUN_ID, RUN_ID]  # one W&B run: its history continues
    second = next(a for a in attempts if a.exit_code == 0)
    assert min(row["epoch"] for row in second.history if "epoch" in row) >= 1


def test_a_signal_marks_the_run_preempting_and_an_error_does_not():
    """SIGINT (KeyboardInterrupt) and SIGTERM are interruptions W&B should requeue; an exception is a failure."""
    from types import SimpleNamespace
    from unittest import mock

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from vit_lightning.run import loggers

    record = SimpleNamespace(record={"status": "failed", "metrics": {"val/acc_best": 0.5}, "compute": {"params": 7}})
    for exception, preempting in ((KeyboardInterrupt(), True), (SIGTERMException(), True), (RuntimeError(), False)):
        logger = loggers.GuardedWandbLogger(mode="offline")
        logger._experiment = run = mock.MagicMock()  # Lightning's cached run: no wandb.init
        trainer = SimpleNamespace(is_global_zero=True, loggers=[logger])
        loggers.WandbSummary(record).on_exception(trainer, None, exception)
        assert run.mark_preempting.called == preempting
        run.summary.update.assert_called_once_with({"val/acc_best": 0.5, "compute/params": 7, "status": "failed"})
    rank1 = SimpleNamespace(is_global_zero=False, loggers=[logger])
    loggers.WandbSummary(record).on_exception(rank1, None, KeyboardInterrupt())
    assert run.mark_preempting.call_count == 0  # only rank 0 has the W&B run


def test_self_hosted_login_is_found_as_wandb_finds_it(tmp_path, monkeypatch):
    """`wandb login --host URL` saves base_url in wandb's settings file and the key in netrc under that host."""
    import wandb

    from vit_lightning.run import loggers

    key = "k" * 40

    def probe(settings_host: str | None, netrc_host: str, **extra) -> tuple[bool, str | None]:
        config = tmp_path / f"config{len(list(tmp_path.iterdir()))}"
        config.mkdir()
        if settings_host:
            (config / "settings").write_text(f"[default]\nbase_url = https://{settings_host}\n")
        netrc = config / "netrc"
        netrc.write_text(f"machine {netrc_host}\n  login user\n  password {key}\n")
        netrc.chmod(0o600)
        with monkeypatch.context() as patch:
            for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_SWEEP_ID"):
                patch.delenv(var, raising=False)
            for var, value in {"WANDB_CONFIG_DIR": str(config), "NETRC": str(netrc), **extra}.items():
                patch.setenv(var, value)
            wandb.teardown()  # wandb reads its settings once per process: start afresh, as a new process would
            try:
                return wandb_backend.has_credentials(), loggers.mode("auto")
            finally:
                wandb.teardown()

    assert probe("wandb.example.org", "wandb.example.org") == (True, "online")
    assert probe("wandb.example.org", "wandb.example.org", WANDB_SWEEP_ID="s1") == (True, "online")  # not offline
    assert probe("wandb.example.org", "api.wandb.ai") == (False, None)  # a key for another server
    assert probe(None, "wandb.example.org", WANDB_BASE_URL="https://wandb.example.org") == (True, "online")
    assert probe(None, "nowhere.example.org", WANDB_API_KEY=key) == (True, "online")
    assert probe(None, "nowhere.example.org", WANDB_SWEEP_ID="s1") == (False, "offline")


# ---- sweeps on the server, job scripts --------------------------------------------------------------------

def test_job_script_joins_sweeps_created_once_and_splits_the_allocation_at_run_time(wandb_server, monkeypatch,
                                                                                  capsys):
    server = wandb_server
    argv = ["pos_encoding", "--profile", "imagenet", "--backend", "wandb", "--project", "vit", "--agents", "4",
            "--gpus-per-agent", "2", "--print-sbatch"]
    assert cli.main(argv) == 0
    script = capsys.readouterr().out
    blocks = len(server.sweeps)  # one W&B sweep per rectangular block of the profile's grid
    assert blocks == len(load("pos_encoding").profiles["imagenet"].grids) > 1
    assert [s.config["name"] for s in server.sweeps] == [f"pos_encoding-imagenet-{k}" for k in range(1, blocks + 1)]
    assert cli.main(argv) == 0 and capsys.readouterr().out == script and len(server.sweeps) == blocks  # joined
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # a login node with 2 GPUs: the script is for the job's node
    assert cli.main(argv) == 0 and capsys.readouterr().out == script
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cli.main([*argv, "--set", "trainer.max_epochs=5"]) == 0 and len(server.sweeps) == 2 * blocks  # new settings
    capsys.readouterr()
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash" and "#SBATCH --gpus-per-node=8" in lines and "#SBATCH --requeue" in lines
    assert "#SBATCH --signal=B:USR1@120" in lines and "#SBATCH --nodes=1" in lines
    options = {line.split()[1].split("=")[0]: line.split()[1] for line in lines if line.startswith("#SBATCH")}
    # the imagenet profile's 10 loader workers per GPU, plus one CPU per trial process, for 8 GPUs: 88, more than
    # many 8-GPU nodes have (sbatch refuses the script there): capped, and said as a line to edit
    [cpus] = [line for line in lines if line.startswith("#SBATCH --cpus-per-task=")]
    assert options["--cpus-per-task"] == f"--cpus-per-task={jobscript.CPU_CAP}" and "edit: 88 wanted" in cpus
    assert options["--open-mode"] == "--open-mode=append"
    assert "--mem" in options and "--output" in options and "--time" in options
    assert any(line.startswith("##SBATCH --partition=") for line in lines)
    assert any(line.startswith("##SBATCH --account=") for line in lines)
    assert "scontrol requeue" in script  # a time-limited job requeues itself once its agents stopped
    [command] = [line.split() for line in lines if " sweep " in line and line.endswith("&")]
    assert Path(command[0]).is_absolute() and command[1] == "sweep"
    assert command[command.index("--entity") + 1] == "me"  # explicit, from the account's default
    assert [command[i + 1] for i, x in enumerate(command) if x == "--sweep-id"] == [f"me/vit/id{k}" for k in
                                                                                   range(1, blocks + 1)]
    # the job runs that line on its node: agents in parallel on the GPUs the allocation gives it
    started = []
    monkeypatch.setattr(wandb_backend, "run_agents", lambda agents, stagger: started.extend(agents) or 0)
    monkeypatch.setattr("wandb.sweep", lambda *a, **k: pytest.fail("a job must not create sweeps"))
    monkeypatch.setattr(machine, "problem", lambda flat, **_: None)  # the node has the GPUs, CPUs and data asked for
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7,0,1,2,3")
    for key, value in SLURM_ARRAY_TASK.items():
        monkeypatch.setenv(key, value)
    assert cli.main(command[2:-1]) == 0
    assert [a.env["CUDA_VISIBLE_DEVICES"] for a in started] == ["4,5", "6,7", "0,1", "2,3"]
    assert all(c[-3:-1] == ("agent", "--forward-signals") for a in started for c in a.commands)
    env = wandb_backend.agent_env(os.environ, started[0].env)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert "SLURM_NTASKS" not in env and env["SLURM_JOB_ID"] == "4243" and env["CUDA_VISIBLE_DEVICES"] == "4,5"


def test_an_unreachable_server_is_one_line(monkeypatch, capsys):
    def refuse():
        raise ConnectionError("HTTPSConnectionPool(host='wandb.example.org', port=443): Max retries exceeded\n"
                              "Caused by NewConnectionError: Connection refused")

    monkeypatch.setattr("wandb.Api", refuse)
    monkeypatch.setattr(wandb_backend, "has_credentials", lambda: True)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the tests' own "disabled" would stop the backend first
    assert cli.main(["hybrid", "--backend", "wandb", "--print-sbatch"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "Connection refused" in captured.err


def test_the_wandb_backend_with_wandb_mode_offline_says_that_not_that_credentials_are_missing(monkeypatch, capsys):
    monkeypatch.setattr(wandb_backend, "has_credentials", lambda: True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert cli.main(["hybrid", "--backend", "wandb", "--print-sbatch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "WANDB_MODE=offline" in err[0] and "credentials" not in err[0], err


def test_the_world_size_is_part_of_a_runs_identity():
    gpu = {"trainer.accelerator": "gpu", "trainer.devices": "auto"}
    assert [world_size(gpu, g) for g in (1, 2, 8)] == [1, 2, 8]
    assert world_size({"trainer.accelerator": "cpu", "trainer.devices": "auto"}, 8) == 1
    assert world_size({"trainer.devices": "0,1", "trainer.num_nodes": 2}, 8) == 4
    assert world_size({"trainer.devices": [0, 1, 2]}, 8) == world_size({"trainer.devices": "3"}, 0) == 3
    config = yaml.safe_load((Path(__file__).parent.parent / "sweeps" / "pos_encoding-imagenet-1.yaml").read_text())
    two, four = (trials.build([config], gpus=g)[0] for g in (2, 4))
    assert two.params == four.params and two.id != four.id and "-w2-" in two.id and "-w4-" in four.id
    assert trials.build([config], gpus=1)[0].id == run_name(two.params)  # one GPU: the name of old


# ---- SLURM: a multi-node trial from a printed trial config --------------------------------------------

SRUN_TASK = {"SLURM_JOB_ID": "5151", "SLURM_JOB_NAME": "vit-trial", "SLURM_NTASKS": "16",
             "SLURM_NTASKS_PER_NODE": "8", "SLURM_NNODES": "2", "SLURM_NODELIST": "node[1-2]", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_ID": "0"}


def test_a_printed_trial_config_runs_under_srun_and_requeues_into_its_own_run_dir(tmp_path, monkeypatch, capsys):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from vit_lightning.commands.fit import cli as fitcli
    from vit_lightning.run import rundir

    monkeypatch.chdir(tmp_path)
    assert cli.main(["pos_encoding", "--trial-config", "2"]) == 0
    (tmp_path / "trial.yaml").write_text(capsys.readouterr().out)
    for key, value in SRUN_TASK.items():
        monkeypatch.setenv(key, value)
    fit = fitcli.FitCLI(["--config", "trial.yaml", "--trainer.num_nodes=2", "--trainer.devices=8",
                        "--trainer.strategy=ddp"])
    assert isinstance(fit.trainer.strategy.cluster_environment, SLURMEnvironment)
    assert fit.trainer.world_size == 16 and "-w16-" in fit.run_dir.name
    run_dir = fit.run_dir.resolve()
    assert run_dir.parent == tmp_path / "runs" / "pos_encoding" / "demo"
    # Lightning's SLURM requeue (SIGUSR1) checkpoint goes to this trial's run dir, and is resumed from there only
    assert Path(fit.trainer.default_root_dir).resolve() == run_dir
    hpc = Path(fit.trainer._checkpoint_connector.hpc_save_path(fit.trainer.default_root_dir)).resolve()
    assert hpc.parent == run_dir and hpc.name == "hpc_ckpt_1.ckpt"
    # a requeued job resumes from the newer of the epoch's last.ckpt and Lightning's requeue checkpoint
    run_dir.mkdir(parents=True)
    (run_dir / "last.ckpt").write_bytes(b"end of an epoch")
    hpc.write_bytes(b"at the requeue signal")
    os.utime(run_dir / "last.ckpt", (1000, 1000))
    assert rundir.resume_point(run_dir) == hpc
    os.utime(hpc, (10, 10))
    assert rundir.resume_point(run_dir) == run_dir / "last.ckpt"
    # the config is the sweep's trial 2, with the multi-node settings given beside it
    trial = trials.build([config for _, config in cli.load_configs(["pos_encoding"], None)])[1]
    given = normalize(flatten(fit.config.as_dict()))
    assert all(same(value, given[key]) for key, value in trial.params.items() if key != "trainer.devices")


# ---- data: agents starting together download once ------------------------------------------------------

def test_concurrent_downloads_take_turns(tmp_path, monkeypatch):

    busy, overlaps, calls = threading.Lock(), [], []

    class SlowCifar:
        def __init__(self, root, train=True, download=False):
            if not busy.acquire(blocking=False):
                overlaps.append(root)
                return
            calls.append(root)
            time.sleep(0.2)
            busy.release()

    from vit_lightning.data.sources import _Cifar

    source = object.__new__(_Cifar)
    source.root, source.download, source.name, source.tv_class = str(tmp_path), True, "cifar10", SlowCifar
    workers = [threading.Thread(target=source.prepare) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert overlaps == [] and len(calls) == 3


def test_fit_with_w_and_b_unreachable_says_so_in_one_line_and_logs_offline(tmp_path, tiny_fit):
    """A compute node without internet: wandb.init fails once, fit goes on with an offline W&B run."""
    env = {**bare_env(tmp_path), "WANDB_MODE": "online", "WANDB_API_KEY": "x" * 40, "WANDB_INIT_TIMEOUT": "8",
           "WANDB_BASE_URL": "http://127.0.0.1:9", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    for key in SLURM_ARRAY_TASK:
        env.pop(key, None)
    argv = [sys.executable, "-m", "vit_lightning.cli", "fit", *tiny_fit(2, 1), "--trainer.max_epochs=1",
            "--run.fewshot_shots=[]", f"--run.root={tmp_path / 'runs'}", "--run.wandb=online"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "W&B is unreachable" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/*/*/results.json")]
    assert record["status"] == "completed"
    [run] = [wandb_agent.read_run(p) for p in wandb_agent.offline_runs(tmp_path / "runs")]
    assert run.summary["val/acc_best"] == record["metrics"]["val/acc_best"]


def test_a_local_resume_continues_the_w_and_b_run_in_its_own_project_and_entity(tmp_path, monkeypatch):
    """An agent's trial resumed outside the agent goes on in the run it recorded: id, project and entity."""
    from vit_lightning.run import loggers
    from vit_lightning.run.rundir import write_record

    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    write_record(tmp_path, {"status": "interrupted",
                            "wandb": {"run_id": "r123", "project": "sweep-proj", "entity": "team", "sweep_id": "s"}})
    config = {"run.wandb": "offline", "run.retrain": False, "run.wandb_project": None, "run.ablation": "a",
              "run.profile": "demo"}
    init = loggers.logger(tmp_path, config)._wandb_init
    assert (init["id"], init["project"], init["entity"]) == ("r123", "sweep-proj", "team")
    write_record(tmp_path, {"status": "completed", "wandb": {"run_id": "r123", "project": "sweep-proj"}})
    init = loggers.logger(tmp_path, config)._wandb_init
    assert not init.get("id") and init["project"] == "vit-lightning" and not init.get("entity")  # a new run


def test_a_resend_after_the_service_died_skips_the_rows_a_server_already_has(monkeypatch, capsys):
    """Online, the resumed run's summary says how far the server got: only the rows past it are sent again."""
    from types import SimpleNamespace
    from unittest import mock

    import wandb

    from vit_lightning.run import loggers

    monkeypatch.setattr(loggers._Service, "gone", False)  # restored after the test, whatever happens in it
    logger = loggers.GuardedWandbLogger(mode="online", name="trial", save_dir="/tmp/x", project="p", group="g",
                                        tags=["g", "demo"])
    dead = mock.MagicMock(id="r1", project="p", entity="team")
    dead.log.side_effect = ConnectionResetError("Connection lost")  # the service died between two steps
    logger._experiment = dead  # Lightning's cached run: no wandb.init
    logger.log_hyperparams({"model.lr": 0.002})
    for step in (9, 19, 29, 39):
        logger.log_metrics({"train/loss": 1.0 / step}, step=step)
    logger.update_summary({"status": "interrupted"})
    logger.mark_preempting()
    assert loggers._Service.gone
    resumed = mock.MagicMock(summary=SimpleNamespace(get={"trainer/global_step": 19}.get, update=mock.MagicMock()))
    init = mock.MagicMock(return_value=resumed)
    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setattr(wandb, "teardown", mock.MagicMock())
    finish = mock.MagicMock()
    monkeypatch.setattr(loggers, "finish", finish)
    logger.close(exit_code=1)
    kwargs = init.call_args.kwargs
    assert (kwargs["id"], kwargs["project"], kwargs["entity"], kwargs["resume"]) == ("r1", "p", "team", "allow")
    assert [c.args[0]["trainer/global_step"] for c in resumed.log.call_args_list] == [29, 39]
    resumed.config.update.assert_called_once_with({"model.lr": 0.002}, allow_val_change=True)
    resumed.summary.update.assert_called_once_with({"status": "interrupted"})
    resumed.mark_preempting.assert_called_once_with()
    finish.assert_called_once_with(1)
    assert "resumed in a new service process" in capsys.readouterr().err

"""The local backend under stress: two sweeps on one run root, a trial stopped alone, a runner that cannot write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import yaml

from vit_lightning.commands.sweep import cli, local, trials


def sweep_command(sweep: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vit_lightning.cli", "sweep", sweep, "--backend", "local", *extra]


def trial_ids(sweep: str) -> list[str]:
    return [t.id for t in trials.build([yaml.safe_load(Path(sweep).read_text())])]


def wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def assert_each_trained_once(stand_in, tmp_path: Path, sweep: str) -> None:
    """Every trial ran to its end exactly once; the shared state and the records agree."""
    ids = trial_ids(sweep)
    assert Counter(e.split()[1] for e in stand_in.events() if e.startswith("end")) == Counter(ids)
    assert {k: (v["status"], v["attempts"]) for k, v in stand_in.state().items()} == {i: ("completed", 1) for i in ids}
    run_dir = tmp_path / "runs" / "fake" / "demo"
    assert {i: json.loads((run_dir / i / "results.json").read_text())["status"] for i in ids} == dict.fromkeys(
        ids, "completed")


# --- two sweeps, one run root --------------------------------------------------------------------------
def test_a_second_sweep_started_later_skips_the_trial_the_first_one_trains(stand_in, tmp_path):
    sweep, gate = stand_in.sweep(), tmp_path / "gate"
    env = {**os.environ, "FAKE_MARKER": str(tmp_path / "marker.txt")}
    first = subprocess.Popen(sweep_command(sweep), env={**env, "FAKE_GATE": str(gate)}, stderr=subprocess.PIPE,
                             text=True)
    try:
        wait_for(lambda: stand_in.events())  # the first sweep's trial 1 is running (held at the gate)
        second = subprocess.run(sweep_command(sweep), env=env, capture_output=True, text=True, timeout=300)
    finally:
        gate.touch()
        _, err = first.communicate(timeout=300)
    # the trial left to the live first sweep is no failure of the second (a job array task: afterok must hold)
    assert second.returncode == 0 and "trial 1/4 skipped: " in second.stderr, second.stderr
    assert "1 left to another process" in second.stderr
    assert first.returncode == 0 and err.count("skipped: done in the meantime") == 3, err
    assert_each_trained_once(stand_in, tmp_path, sweep)
    again = subprocess.run(sweep_command(sweep), env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "4 done, 0 to run" in again.stderr


def test_two_sweeps_started_together_train_each_trial_once(stand_in, tmp_path):
    sweep = stand_in.sweep(lrs=(0.1, 0.2, 0.3))
    env = {**os.environ, "FAKE_MARKER": str(tmp_path / "marker.txt"), "FAKE_SLEEP": "0.5"}
    procs = [subprocess.Popen(sweep_command(sweep, "--parallel", "2"), env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=300)[1] for proc in procs]
    assert {proc.returncode for proc in procs} <= {0, 1}, outputs
    assert_each_trained_once(stand_in, tmp_path, sweep)


def test_the_run_root_spelled_two_ways_is_one_run_root(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    config = yaml.safe_load(Path(stand_in.sweep()).read_text())
    spelled = {}
    for name, root in [("relative", "runs"), ("absolute", str(tmp_path / "runs")), ("dotted", "./runs/../runs")]:
        config["parameters"]["run.root"] = {"value": root}
        spelled[name] = tmp_path / f"{name}.yaml"
        spelled[name].write_text(yaml.safe_dump(config))
    assert cli.main([str(spelled["relative"]), "--backend", "local"]) == 0
    capsys.readouterr()
    assert cli.main([str(spelled["absolute"]), str(spelled["dotted"]), "--backend", "local"]) == 0
    assert "[sweep] 4 trials: 4 done, 0 to run" in capsys.readouterr().err  # one set of trials, all done
    assert sum(e.startswith("end") for e in stand_in.events()) == 4


# --- a trial stopped alone ----------------------------------------------------------------------------------
def test_sigterm_to_the_trial_alone_leaves_it_interrupted_and_a_plain_rerun_resumes_it(stand_in, tmp_path, monkeypatch):
    sweep, gate = stand_in.sweep(), tmp_path / "gate"
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    monkeypatch.setenv("FAKE_GATE", str(gate))

    def running() -> list[int]:
        return [t["pid"] for t in stand_in.state().values() if t.get("status") == "running"]

    def preempt_the_first_trial():
        try:  # the trial may log its start before the runner records it as running: wait for both
            wait_for(lambda: stand_in.events() and running())
            [pid] = running()
            first = stand_in.events()[0].split()[1]
            os.killpg(pid, signal.SIGTERM)  # the trial's process group, not the sweep (pre-emption, OOM-killer style)
            wait_for(lambda: f"signal15 {first}" in stand_in.events())  # the next trial may start right after
        finally:
            gate.touch()  # never leave the next trial waiting, whatever happened here

    thread = threading.Thread(target=preempt_the_first_trial, daemon=True)
    thread.start()
    assert cli.main([sweep, "--backend", "local"]) == 1  # not every trial is done yet
    thread.join()
    first = trial_ids(sweep)[0]
    assert stand_in.events()[:2] == [f"start {first}", f"signal15 {first}"]
    saved = stand_in.state()
    assert (saved[first]["status"], saved[first]["error"]) == ("interrupted", "stopped by SIGTERM")
    assert cli.main([sweep, "--backend", "local"]) == 0  # no --retry-failed: it was interrupted, not failed
    assert [e for e in stand_in.events() if e.startswith("end")].count(f"end {first}") == 1


# --- the runner itself fails ----------------------------------------------------------------------------------
def test_a_read_only_run_root_stops_the_sweep_in_one_line(stand_in, readonly_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    config = yaml.safe_load(Path(stand_in.sweep()).read_text())
    config["parameters"]["run.root"] = {"value": str(readonly_dir / "runs")}
    (tmp_path / "ro.yaml").write_text(yaml.safe_dump(config))
    assert cli.main([str(tmp_path / "ro.yaml"), "--backend", "local"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[sweep] 4 trials")]
    assert len(err) == 1 and err[0].startswith(f"vit-ablate sweep: error: {readonly_dir / 'runs'}: "), err
    assert stand_in.events() == []  # nothing started


def test_a_trial_that_cannot_be_launched_stops_the_sweep_in_one_line(stand_in, tmp_path, capsys):
    config = yaml.safe_load(Path(stand_in.sweep()).read_text())
    config["command"] = [str(tmp_path / "no-such-program"), "${args}"]
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump(config))
    assert cli.main([str(tmp_path / "missing.yaml"), "--backend", "local"]) == 1
    assert capsys.readouterr().err.splitlines()[1:] == [
        f"vit-ablate sweep: error: {tmp_path / 'no-such-program'}: No such file or directory; the sweep stopped, "
        "its trials with it"]  # after the plan line, only this: the second trial was not tried


def _failing_state_write(monkeypatch, when: str, started: list):
    """State writes with status `when` fail as on a full disk; started processes are collected."""
    update, start = local.State.update, local.Supervisor.start

    def update_or_fail(self, trial, **fields):
        if fields.get("status") == when:
            raise OSError(28, "No space left on device", str(trial.record_dir / local.STATE))
        update(self, trial, **fields)

    def start_and_keep(self, *args, **kwargs):
        proc = start(self, *args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(local.State, "update", update_or_fail)
    monkeypatch.setattr(local.Supervisor, "start", start_and_keep)


def test_a_state_write_that_fails_stops_the_sweep_and_its_running_trial(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    monkeypatch.setenv("FAKE_GATE", str(tmp_path / "never"))  # the trial would run until stopped
    started: list[subprocess.Popen] = []
    _failing_state_write(monkeypatch, "running", started)
    sweep = stand_in.sweep()
    assert cli.main([sweep, "--backend", "local"]) == 1
    err = capsys.readouterr().err.splitlines()
    state_path = tmp_path / "runs" / "fake" / "demo" / local.STATE
    assert err[-1] == (f"vit-ablate sweep: error: {state_path}: No space left on device; the sweep stopped, "
                       "its trials with it")
    # stopped (before or after it set up its handler) and reaped
    assert len(started) == 1 and started[0].returncode in (-signal.SIGTERM, 128 + signal.SIGTERM)
    assert not any(e.startswith("end") for e in stand_in.events())


def test_a_state_write_that_fails_after_a_trial_stops_the_sweep(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    started: list[subprocess.Popen] = []
    _failing_state_write(monkeypatch, "completed", started)
    assert cli.main([stand_in.sweep(), "--backend", "local"]) == 1
    assert capsys.readouterr().err.splitlines()[-1].endswith("No space left on device; the sweep stopped, "
                                                             "its trials with it")
    assert len(started) == 1 and [e.split()[0] for e in stand_in.events()] == ["start", "end"]


def test_an_unreadable_state_file_is_replaced_with_a_warning(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    path = tmp_path / "runs" / "fake" / "demo" / local.STATE
    path.parent.mkdir(parents=True)
    path.write_text('{"trials": {"x": {"sta')
    assert cli.main([stand_in.sweep(), "--backend", "local"]) == 0
    err = capsys.readouterr().err  # named once, rebuilt from the records (none yet) before any trial runs
    assert err.count(f"[sweep] {path}: damaged sweep state (not JSON, truncated or overwritten: ") == 1
    assert "rebuilt from the records: 0 trial(s)" in err and path.with_name(local.STATE + ".damaged").exists()
    assert {t["status"] for t in stand_in.state().values()} == {"completed"} and len(stand_in.state()) == 4


# --- nothing runs from the working directory -------------------------------------------------------------------
def test_an_ablations_folder_in_the_working_directory_is_never_run(tmp_path, monkeypatch, capsys):
    from vit_lightning.commands.results import cli as table_cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ablations").mkdir()
    planted = "import pathlib; pathlib.Path('ran').write_text('code from the working directory ran')\n"
    for name in ("pos_encoding", "__init__", "mine"):
        (tmp_path / "ablations" / f"{name}.py").write_text(planted)
    assert cli.main(["pos_encoding", "--dry-run"]) == 0 and cli.main(["mine", "--dry-run"]) == 2
    assert table_cli.main(["pos_encoding", "--out", str(tmp_path / "out")]) == 0
    assert table_cli.main(["mine"]) == 2
    assert not (tmp_path / "ran").exists()

"""`sweep --dry-run` says how many trials there are, where their records go and each one's state; it prints the
command of each trial still to run, and after a finished sweep no command at all."""

from __future__ import annotations

import json

import yaml

from vit_lightning.commands.sweep import cli, trials, yamls
from vit_lightning.commands.sweep.local import State


def sweep(tmp_path) -> tuple[str, list]:
    config = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"}, "command": yamls.COMMAND,
              "parameters": {"model.lr": {"values": [0.001, 0.002, 0.003]}, "run.root": {"value": str(tmp_path)}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path), trials.build([config])


def finish(trial) -> None:
    trial.run_dir.mkdir(parents=True)
    (trial.run_dir / "results.json").write_text(json.dumps({"trial": trial.id, "status": "completed"}))


def dry_run(path, capsys, *extra) -> list[str]:
    assert cli.main([path, "--dry-run", *extra]) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_the_dry_run_gives_the_count_the_folder_and_each_trials_state(tmp_path, capsys):
    path, (first, second, third) = sweep(tmp_path)
    folder = first.record_dir
    assert dry_run(path, capsys) == [f"# 3 trials, records in {folder}: 0 done, 3 to run, 0 failed",
                                     first.shell(), second.shell(), third.shell()]
    finish(first)
    State().update(second, status="failed")
    assert dry_run(path, capsys) == [
        f"# 3 trials, records in {folder}: 1 done, 1 to run, 1 failed", f"# done: {first.id}",
        f"# failed: {second.id} (--retry-failed runs it again)", third.shell()]
    assert dry_run(path, capsys, "--retry-failed")[2:] == [second.shell(), third.shell()]
    finish(second), finish(third)
    assert dry_run(path, capsys) == [f"# 3 trials, records in {folder}: 3 done, 0 to run, 0 failed",
                                     *(f"# done: {t.id}" for t in (first, second, third))]  # no command again

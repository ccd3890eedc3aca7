"""One owner of a run directory's files: rundir reads and writes results.json and checkpoints, under its lock."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from vit_lightning import cli
from vit_lightning.run import rundir

PACKAGE = Path(rundir.__file__).parent
IMPORT = re.compile(r"\s*(from|import) ")
RECORD = {"status": "completed", "trial": "t", "metrics": {"val/acc_best": 0.5}}


def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "a" / "p" / "t"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(RECORD))
    return run


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", [["fewshot"], ["eval", "--into-record", "--shots"]])
def test_a_writer_outside_fit_refuses_a_run_that_a_fit_holds(tmp_path, capsys, command):
    run = run_dir(tmp_path)
    lock = rundir.acquire(run)  # what a training fit holds for its whole life
    try:
        before = files(tmp_path)
        assert cli.main([command[0], str(run), *command[1:]]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{run} is being trained by pid " in err[0], err
        assert files(tmp_path) == before  # nothing written: no record change, no eval file
    finally:
        rundir.release(lock)


def test_update_record_changes_the_record_under_the_lock(tmp_path):
    run = run_dir(tmp_path)
    seen = []

    def change(record: dict) -> None:
        with pytest.raises(rundir.Busy):  # held while the change is made
            rundir.acquire(run)
        seen.append(json.loads(json.dumps(record)))
        record["metrics"]["val/fewshot5"] = 0.25

    assert rundir.update_record(run, change)["metrics"] == {"val/acc_best": 0.5, "val/fewshot5": 0.25}
    written = rundir.read_record(run)
    stamp = datetime.fromisoformat(written.pop("updated_at"))  # when, so a table copies the record again
    assert abs((datetime.now(timezone.utc) - stamp).total_seconds()) < 60
    assert seen == [RECORD] and written == {**RECORD, "metrics": {**RECORD["metrics"], "val/fewshot5": 0.25}}
    rundir.release(rundir.acquire(run))  # and released afterwards
    lock = rundir.acquire(run)
    try:
        with pytest.raises(rundir.Busy):
            rundir.update_record(run, change)
    finally:
        rundir.release(lock)


def test_a_missing_or_corrupt_record_is_one_line_and_nothing_is_written(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert rundir.read_record(empty) is None
    with pytest.raises(rundir.RunDirError, match=f"^no results.json in {re.escape(str(empty))}$"):
        rundir.update_record(empty, dict.clear)
    assert list(empty.iterdir()) == []
    (empty / "results.json").write_text('{"metrics": ')
    for read in (rundir.read_record, lambda d: rundir.update_record(d, dict.clear)):
        with pytest.raises(rundir.RunDirError) as error:
            read(empty)
        assert "\n" not in str(error.value) and str(error.value).startswith(f"cannot read {empty / 'results.json'}: ")
    assert (empty / "results.json").read_text() == '{"metrics": '
    (empty / "results.json").write_text("[1]")
    with pytest.raises(rundir.RunDirError, match="not a JSON object"):
        rundir.read_record(empty)


def test_eval_into_a_record_that_is_not_there_is_one_line(tmp_path, capsys):
    (tmp_path / "x.ckpt").write_bytes(b"not a checkpoint")
    assert cli.main(["eval", str(tmp_path / "x.ckpt"), "--into-record", "--shots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vit-ablate eval: error: ")
    assert [p.name for p in tmp_path.iterdir()] == ["x.ckpt"]


def test_only_rundir_opens_a_runs_record_and_checkpoints():
    names = re.compile(r"\bRECORD\b|results\.json|\bLAST_CKPT\b|last\.ckpt|hpc_ckpt")
    opens = re.compile(r"read_text|read_bytes|write_text|write_bytes|\bopen\(|json\.load|torch\.load|write_atomic")
    offenders = [f"{path.relative_to(PACKAGE)}:{n}" for path in PACKAGE.rglob("*.py") if path.name != "rundir.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if names.search(line) and opens.search(line) and not IMPORT.match(line)]
    assert offenders == []
    loads = [p.name for p in PACKAGE.rglob("*.py") if "torch.load(" in p.read_text()]
    assert sorted(loads) == ["rundir.py", "transfer.py"]  # transfer: a timm model's state dict (timm:NAME@FILE)

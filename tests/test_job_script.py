"""Every `vit-ablate sweep` flag that changes what a job does reaches the job script `--print-sbatch` prints, and a
damaged bayes journal is named in one line (with --repair: the job rebuilds it), never a traceback."""

from __future__ import annotations

import pytest
import yaml
from test_sweep_search import config

from vit_lightning.commands.sweep import cli
from vit_lightning.commands.sweep.search import Search

BASE = ["hybrid", "--profile", "cifar10", "--backend", "local", "--print-sbatch"]
# (flag and its value, what the job's `vit-ablate sweep` line must then hold)
CHANGES = [(["--repair"], " --repair"), (["--retry-failed"], " --retry-failed"),
           (["--fresh-processes"], " --fresh-processes"), (["--seed", "7"], " --seed 7"),
           (["--parallel", "2"], " --parallel 2"), (["--trials-per-gpu", "2"], " --trials-per-gpu 2"),
           (["--count", "3"], " --count 3"), (["--set", "trainer.max_epochs=3"], " --set trainer.max_epochs=3"),
           (["--seeds-per-point", "3"], " --seeds-per-point 3"), (["--confirm", "2,5"], " --confirm 2,5")]
# options that change nothing a local job does, or are not the local job's: the printing ones, the backend (named
# in the script) and the wandb backend's own options; --ablations-dir is checked on its own below
NOT_THE_JOBS = {"-h", "--dry-run", "--print-sbatch", "--trial-config", "--backend", "--profile", "--ablations-dir",
                "--project", "--entity", "--agents", "--gpus-per-agent", "--stagger", "--sweep-id"}


def job_line(capsys, *extra: str) -> str:
    assert cli.main([*BASE, *extra]) == 0, capsys.readouterr().err
    [line] = [x for x in capsys.readouterr().out.splitlines() if " sweep hybrid " in x]
    return line


def test_every_option_is_either_passed_to_the_job_or_named_as_not_the_jobs():
    options = {o for action in cli.parser()._actions for o in action.option_strings if o.startswith("--") or o == "-h"}
    covered = {flag[0] for flag, _ in CHANGES} | {"--extend-edges"}  # checked on its own below
    assert options - covered - {"--help"} == NOT_THE_JOBS


@pytest.mark.parametrize(("flag", "text"), CHANGES, ids=[flag[0] for flag, _ in CHANGES])
def test_a_flag_that_changes_the_job_reaches_its_script(capsys, flag, text):
    plain, flagged = job_line(capsys), job_line(capsys, *flag)
    assert text not in plain and text in flagged and flagged != plain


def test_the_ablations_folder_reaches_the_script_as_an_absolute_path(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    assert f" --ablations-dir {tmp_path / 'mine'} " in job_line(capsys, "--ablations-dir", "mine")


def test_a_damaged_journal_is_refused_for_the_job_without_repair_and_rebuilt_by_the_job_with_it(tmp_path, capsys):
    path = tmp_path / "bayes.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path / "runs", 4)))
    search = Search(config(tmp_path / "runs", 4), 4)
    search.journal.parent.mkdir(parents=True)
    search.journal.write_text('{"proposals": [{"id": "lr')  # truncated mid-write
    sbatch = [str(path), "--backend", "local", "--print-sbatch"]
    assert cli.main(sbatch) == 2
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert out == "" and str(search.journal) in line and "--repair" in line and "at at" not in line
    assert cli.main([*sbatch, "--repair"]) == 0
    out, err = capsys.readouterr()
    [run] = [x for x in out.splitlines() if " sweep " in x]
    assert " --repair" in run and "--repair in the job rebuilds it" in err and "Traceback" not in err
    # a dry run with --repair says what the run would rebuild, and lists the trials: no traceback
    assert cli.main([str(path), "--backend", "local", "--repair", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "journal damaged" in out and "--repair without --dry-run rebuilds it" in err
    assert search.journal.read_text() == '{"proposals": [{"id": "lr'  # nothing written


def test_extend_edges_reaches_the_job(capsys, monkeypatch):
    """--extend-edges (which cells of a selection stage the job trains) is in the job's command; the edges are read
    from the stage's records, here as if every config were an edge cell's extension."""
    from vit_lightning.commands.sweep import select

    monkeypatch.setattr(select, "extend_edges", lambda configs, directory: (configs, ["a cell: lr 0.8 added"]))
    assert " --extend-edges" in job_line(capsys, "--extend-edges")
    assert " --extend-edges" not in job_line(capsys)

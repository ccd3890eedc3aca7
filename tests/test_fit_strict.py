"""`fit` takes option names as exactly as a sweep does, and names every wrong value with its range, in one line,
before its run dir exists."""

from __future__ import annotations

import pytest
from tiny import TINY_MODEL

from vit_lightning.commands.fit import cli as fitcli
from vit_lightning.commands.fit import main as train
from vit_lightning.commands.sweep import cli
from vit_lightning.core.checks import suggest


def one_error(argv, tmp_path, capsys) -> str:
    assert train.main([*TINY_MODEL, f"--run.root={tmp_path / 'runs'}", "--run.wandb=off", *argv]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert not (tmp_path / "runs").exists()
    return line


@pytest.mark.parametrize("given, meant", [("trainer.max_epoch", "trainer.max_epochs"),
                                          ("model.pos_enc", "model.pos_encoding"),
                                          ("model.pos_encodin", "model.pos_encoding")])
def test_an_abbreviated_or_misspelt_option_is_refused_with_the_nearest_names(given, meant, tmp_path, capsys):
    line = one_error([f"--{given}=3"], tmp_path, capsys)
    assert line.startswith(f"vit-ablate fit: error: unknown option --{given} (")
    names = fitcli.fit_options()
    assert meant in names and given not in names
    assert line.endswith(f"({suggest(given, names)})")  # the sweep's own suggestion
    if "did you mean" in line:
        assert meant in line


def test_fit_and_sweep_suggest_the_same_names(tmp_path, capsys):
    fit_line = one_error(["--trainer.max_epoch=1"], tmp_path, capsys)
    assert cli.main(["pos_encoding", "--dry-run", "--set", "trainer.max_epoch=1"]) == 2
    sweep_line = capsys.readouterr().err
    assert "did you mean trainer.max_epochs" in fit_line and "did you mean trainer.max_epochs" in sweep_line


@pytest.mark.parametrize("argv, line", [
    (["--model.lr=-1"], "model.lr=-1.0 is out of range: a number, finite, in (0, 10]"),
    (["--model.momentum=1"], "model.momentum=1.0 is out of range: a number, finite, in [0, 1)"),
    (["--data.val_split=2"], "data.val_split=2.0 is out of range: a number, finite, in (0, 1)"),
    (["--data.num_workers=-1"], "data.num_workers=-1 is out of range: a whole number, finite, in [0, 1024]"),
    (["--trainer.gradient_clip_val=-1"],
     "trainer.gradient_clip_val=-1 is out of range: a gradient norm (0: no clipping), finite, in [0, 1e+06]"),
    (["--run.ddp_timeout_s=0"], "run.ddp_timeout_s=0 is out of range: seconds, finite, in (0, 1e+07]"),
    (["--trainer.gradient_clip_val=.nan"], "trainer.gradient_clip_val=nan is not a finite number; give a finite value"),
    (["--run.ddp_timeout_s=.nan"], "run.ddp_timeout_s=nan is not a finite number; give a finite value"),  # not read as null
    (["--run.ddp_timeout_s=.inf"], "run.ddp_timeout_s=inf is not a finite number; give a finite value"),
    (["--model.lr=.inf"], "model.lr=inf is not a finite number; give a finite value"),
])
def test_a_wrong_number_is_named_with_its_value_and_range(argv, line, tmp_path, capsys):
    assert one_error(argv, tmp_path, capsys) == f"vit-ablate fit: error: {line}"


def test_a_sweep_refuses_a_non_finite_setting_by_name(tmp_path, capsys):
    argv = ["pos_encoding", "--dry-run", "--set", "run.ddp_timeout_s=.nan", "--set", f"run.root={tmp_path}"]
    assert cli.main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    # W&B's agent would hand fit `--run.ddp_timeout_s=nan`, which fit's parser refuses: named before any trial
    assert line.startswith("vit-ablate sweep: error: pos_encoding-demo-1: run.ddp_timeout_s=nan is not valid"), line

"""Every numeric option and sweep setting is a finite number in a stated range, in the Python API, on fit's and
eval's command lines and in sweep files: a non-finite or out-of-range value is one line naming it, before anything
is allocated, trained or written."""

from __future__ import annotations

import math

import pytest
import yaml
from tiny import TINY_MODEL

from vit_lightning.analysis import evaluate
from vit_lightning.commands.fit import main as train
from vit_lightning.commands.sweep import cli
from vit_lightning.model import ViT
from vit_lightning.run.hyperband import parse
from vit_lightning.run.module import Classifier

MICRO = dict(img_size=28, in_chans=1, num_classes=10, patch_size=7)
INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("early, field", [
    ({"min_iter": 2, "eta": NAN}, "early_terminate.eta"), ({"min_iter": 2, "eta": INF}, "early_terminate.eta"),
    ({"max_iter": 27, "s": INF}, "early_terminate.s"), ({"max_iter": 27, "s": NAN}, "early_terminate.s"),
    ({"max_iter": 27, "s": 10**6}, "early_terminate.s"), ({"min_iter": 10**7}, "early_terminate.min_iter"),
    ({"max_iter": 10**7, "s": 2}, "early_terminate.max_iter"), ({"min_iter": 2, "eta": 1e6}, "early_terminate.eta"),
])
def test_non_finite_or_huge_hyperband_settings_name_the_field_and_its_range(early, field):
    with pytest.raises(ValueError) as error:
        parse({"type": "hyperband", **early}, {"name": "val/acc", "goal": "maximize"})
    message = str(error.value)
    assert message.startswith(field) and ("in (1, 1000]" in message or "at most" in message or "in [1, 100]" in message)


def test_a_non_finite_eta_in_a_sweep_file_is_one_line_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
        "early_terminate": {"type": "hyperband", "min_iter": 2, "eta": NAN},
        "command": ["${env}", "vit-ablate", "fit", "${args}"],
        "parameters": {"model.lr": {"values": [0.001, 0.002]}, "run.root": {"value": str(tmp_path / "runs")}}}))
    assert "eta: .nan" in path.read_text()
    assert cli.main([str(path), "--backend", "local", "--dry-run"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "early_terminate.eta must be a number above 1, finite, in (1, 1000], got nan" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("options, mentions", [
    (dict(layer_scale=INF), "layer_scale must be a positive initial value, a finite number in (0, 10]"),
    (dict(layer_scale=NAN), "layer_scale must be a positive"), (dict(layer_scale=100.0), "layer_scale must be"),
    (dict(rope_theta=INF, pos_encoding="rope_axial"), "rope_theta must be a positive base frequency, a finite"),
    (dict(rope_theta=NAN, pos_encoding="rope_mixed"), "rope_theta must be a positive base frequency"),
    (dict(reg_tokens=10**6), "reg_tokens must be a count >= 0 and at most 1024"),
    (dict(reg_tokens=2.5), "reg_tokens must be a count"),
    (dict(img_size=NAN), "img_size must be a positive integer"),
])
def test_the_python_api_refuses_non_finite_and_out_of_range_options(options, mentions):
    with pytest.raises(ValueError) as error:
        ViT("micro", **{**MICRO, **options})
    assert mentions in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("options", [dict(lr=NAN), dict(lr=INF), dict(lr=0.0), dict(weight_decay=INF),
                                     dict(warmup_epochs=NAN), dict(label_smoothing=NAN), dict(momentum=1.5)])
def test_the_optimizer_numbers_are_finite_and_in_range(options):
    with pytest.raises(ValueError) as error:
        Classifier(**options, variant="micro", **MICRO)
    [(key, value)] = options.items()  # the one wrong number: its name, its value and its range, nothing else
    bounds = {"lr": "(0, 10]", "weight_decay": "[0, 10]", "warmup_epochs": "[0, 1e+06]", "label_smoothing": "[0, 1)",
              "momentum": "[0, 1)"}[key]
    assert str(error.value) == f"model.{key}={value!r} is out of range: a number, finite, in {bounds}"


def test_a_huge_reg_tokens_is_refused_by_fit_before_anything_is_allocated(tmp_path, capsys):
    argv = [*TINY_MODEL, "--model.reg_tokens=1000000", "--trainer.max_epochs=1", "--run.wandb=off",
            f"--run.root={tmp_path}"]
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reg_tokens must be a count >= 0 and at most 1024" in err[0], err
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("args, words", [
    (["--model.patch_size=0"], "--model.patch_size=0: a patch side in pixels, 1 to 4096"),
    (["--model.patch_size=-4"], "--model.patch_size=-4: a patch side"),
    (["--model.patch_size=100000"], "--model.patch_size=100000: a patch side"),
    (["--shots", "1000000"], "--shots 1000000: a few-shot k is at most"),
    (["--shuffle-perms", "100000"], "--shuffle-perms 100000: a count of permutations, 0 (none) to 1000"),
])
def test_eval_refuses_out_of_range_numbers_before_reading_anything(tmp_path, args, words):
    parsed, _ = evaluate.parser().parse_known_args([str(tmp_path / "no-such-run"), *args])
    with pytest.raises(ValueError) as error:
        evaluate.check_args(parsed)
    assert words in str(error.value)

"""`vit-ablate eval`: a head never trained on the data's classes reports few-shot only; bad options are one line
before anything is evaluated or written; a Swin run is evaluated like any trained run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny import TINY_MODEL

from vit_lightning import cli
from vit_lightning.commands.fit import main as train

pytestmark = pytest.mark.slow

FIT = [*TINY_MODEL, "--data.batch_size=32", "--trainer.max_epochs=1", "--trainer.limit_train_batches=3",
       "--trainer.limit_val_batches=2", "--run.wandb=off", "--run.fewshot_shots=[]"]


def two_class_folder(root: Path) -> Path:
    """An imagefolder of 2 classes, 4 RGB images each per split."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("ant", "bee"):
            (root / split / name).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A finished 10-class RGB run (synthetic data, 32 px)."""
    root = tmp_path_factory.mktemp("runs")
    assert train.main([*FIT, "--data.name=synthetic", "--data.img_size=32", "--model.patch_size=8", f"--run.root={root}",
                       "--run.trial=src"]) == 0
    return root / "adhoc" / "local" / "src"


def files(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


def test_another_class_count_reports_few_shot_only_and_says_so_in_one_line(source, tmp_path, capsys):
    folder = two_class_folder(tmp_path / "ab")
    data = ["--data.name=imagefolder", f"--data.root={folder}", "--data.img_size=32"]
    out = tmp_path / "e.json"
    capsys.readouterr()
    assert cli.main(["eval", str(source), *data, "--shots", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    said = captured.err.strip().splitlines()
    assert len(said) == 1 and "2 classes" in said[0] and "not reported" in said[0], captured.err
    assert captured.out.startswith("few-shot (frozen features; the head is new") and not re.search(r"top-1 \d", captured.out)
    record = json.loads(out.read_text())
    assert record["new_head"] is True and set(record["metrics"]) == {"val/fewshot1", "val/fewshot1_std"}
    # --new-head: the same numbers, asked for, so nothing to warn about; into the run's record as few-shot only
    assert cli.main(["eval", str(source), *data, "--shots", "1", "--new-head", "--into-record",
                     "--out", str(tmp_path / "f.json")]) == 0
    assert capsys.readouterr().err == ""
    assert json.loads((tmp_path / "f.json").read_text())["metrics"] == record["metrics"]
    evals = json.loads((source / "results.json").read_text())["eval"]
    # few-shot only, and the attention read-outs (they need no head)
    assert {k for k in evals["imagefolder@32px/native"] if not k.startswith("attn/")} == {"val/fewshot1", "val/fewshot1_std"}
    assert "attn/entropy" in evals["imagefolder@32px/native"]
    # without shots there is nothing to report: one line, nothing written
    before = files(tmp_path)
    assert cli.main(["eval", str(source), *data, "--shots", "--out", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "only few-shot" in err[0] and files(tmp_path) == before


def test_the_same_classes_with_new_head_report_few_shot_only(source, tmp_path, capsys):
    out = tmp_path / "e.json"
    assert cli.main(["eval", str(source), "--shots", "1", "--new-head", "--out", str(out)]) == 0
    assert "val/acc" not in json.loads(out.read_text())["metrics"]
    assert cli.main(["eval", str(source), "--shots", "1", "--out", str(out)]) == 0  # the source's own head
    metrics = json.loads(out.read_text())["metrics"]
    assert 0 <= metrics["val/acc"] <= metrics["val/acc5"] <= 1
    # shuffled patches: the same intact top-1 as val/acc (one model, one split), and so the drop from it
    assert metrics["val/shuffle_drop"] == pytest.approx(metrics["val/acc"] - metrics["val/acc_shuffled"], abs=1e-6)
    assert cli.main(["eval", str(source), "--shuffle-perms", "0", "--out", str(out)]) == 0
    assert "val/acc_shuffled" not in json.loads(out.read_text())["metrics"]


@pytest.mark.parametrize("args, words", [
    (["--shots", "0"], "--shots 0: a few-shot k"),
    (["--shots", "5", "-1"], "--shots -1: a few-shot k"),
    (["--device", "cuda:7"], "--device cuda:7: this machine has"),
    (["--shuffle-perms", "-1"], "--shuffle-perms -1: a count of permutations"),
    (["--device", "tpu9"], "--device tpu9:"),
    (["--out", "{file}/x/e.json"], "is not a folder"),
    (["--out", "{tmp}"], "is a folder"),
    (["--data.img_size=abc"], "data.img_size='abc' is not a number: a whole number, finite, in [1, 65536]"),
    (["--data.val_split=2"], "data.val_split=2 is out of range: a number, finite, in (0, 1)"),
])
def test_bad_options_are_one_line_before_anything_is_written(source, tmp_path, capsys, args, words):
    (tmp_path / "file").write_text("not a folder")
    args = [a.format(file=tmp_path / "file", tmp=tmp_path) for a in args]
    before, beside = files(tmp_path), files(source)
    assert cli.main(["eval", str(source), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "Traceback" not in err[0], err
    assert files(tmp_path) == before and files(source) == beside


def test_into_record_without_a_record_is_one_line_before_the_eval_is_written(source, tmp_path, capsys):
    ckpt = tmp_path / "loose.ckpt"
    ckpt.write_bytes((source / "last.ckpt").read_bytes())
    before = files(tmp_path)
    assert cli.main(["eval", str(ckpt), "--shots", "1", "--into-record"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--into-record: cannot read the run record" in err[0], err
    assert files(tmp_path) == before
    assert cli.main(["eval", "timm:vit_tiny_patch16_224", "--into-record"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no run record" in err[0], err


def test_a_swin_run_is_evaluated_as_trained(tmp_path, capsys):
    from vit_lightning.analysis.trained import build_data
    from vit_lightning.run.module import Classifier

    torch.manual_seed(0)
    swin = Classifier(arch="swin", variant="micro", patch_size=2, img_size=28, in_chans=1, num_classes=10).eval()
    torch.save({"state_dict": swin.state_dict(), "hyper_parameters": dict(swin.hparams)}, tmp_path / "swin.ckpt")
    out = tmp_path / "e.json"
    assert cli.main(["eval", str(tmp_path / "swin.ckpt"), "--data.name=mnist5k", "--shots", "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())["metrics"]
    # top-1 by hand: the model's argmax over the whole validation split
    data = build_data({"name": "mnist5k"})
    with torch.no_grad():
        hits = sum(int((swin.model(x).argmax(1) == y).sum()) for x, y in data.val_dataloader())
    assert metrics["val/acc"] == pytest.approx(hits / len(data.val_set))
    assert cli.main(["eval", str(tmp_path / "swin.ckpt"), "--data.name=mnist5k", "--data.img_size=56"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "evaluated at its own image size" in err[0], err

"""Few-shot linear evaluation: the probe on constructed features, the draw, the fit's record, the CLI, the table."""

from __future__ import annotations

import csv
import json
import math
import random

import numpy as np
import pytest
import torch
from tiny import TINY_MODEL

from vit_lightning import ablation as ablations
from vit_lightning import cli
from vit_lightning.ablation import Ablation, Profile
from vit_lightning.analysis import fewshot
from vit_lightning.commands.fit import main as train
from vit_lightning.commands.results import cli as table_cli
from vit_lightning.data.datamodule import ImageDataModule
from vit_lightning.model import ViT

TINY = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2"]
NAMES = [name for k in fewshot.SHOTS for name in fewshot.metric_names(k)]


def clusters(per_class: int, num_classes: int, dim: int, spread: float, seed: int):
    """Points around one far-apart centre per class: features (N, D) and labels (N,)."""
    gen = torch.Generator().manual_seed(seed)
    centres = 10.0 * torch.randn(num_classes, dim, generator=gen)
    y = torch.arange(num_classes).repeat_interleave(per_class)
    return centres[y] + spread * torch.randn(len(y), dim, generator=gen), y


def global_rng_states():
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()


def same_states(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


# ---- the probe on constructed features -------------------------------------------------------------

def test_separable_classes_give_accuracy_one():
    train_x, train_y = clusters(40, 6, 16, 0.5, seed=0)
    val_x, val_y = clusters(30, 6, 16, 0.5, seed=0)  # same centres (same seed), fresh noise below
    val_x = val_x + 0.5 * torch.randn(val_x.shape, generator=torch.Generator().manual_seed(1))
    scores = fewshot.fewshot_accuracy(train_x, train_y, val_x, val_y, 6, shots=(1, 5, 25), draws=3)
    assert scores == {"val/fewshot1": 1.0, "val/fewshot1_std": 0.0, "val/fewshot5": 1.0, "val/fewshot5_std": 0.0,
                      "val/fewshot25": 1.0, "val/fewshot25_std": 0.0}


def test_random_labels_give_chance():
    gen = torch.Generator().manual_seed(0)
    k = 5
    train_x, val_x = torch.randn(600, 32, generator=gen), torch.randn(3000, 32, generator=gen)
    train_y, val_y = torch.randint(0, k, (600,), generator=gen), torch.randint(0, k, (3000,), generator=gen)
    scores = fewshot.fewshot_accuracy(train_x, train_y, val_x, val_y, k, shots=(5, 25), draws=3)
    # 3 draws x 3000 val images: the standard error of a chance accuracy is about 0.005
    assert scores["val/fewshot5"] == pytest.approx(1 / k, abs=0.03)
    assert scores["val/fewshot25"] == pytest.approx(1 / k, abs=0.03)


@pytest.mark.parametrize("n, d", [(30, 8), (6, 10)])  # more points than dimensions, and fewer
def test_ridge_equals_lstsq_on_the_augmented_system(n, d):
    gen = torch.Generator().manual_seed(n)
    x, y = torch.randn(n, d, generator=gen, dtype=torch.float64), torch.randn(n, 3, generator=gen, dtype=torch.float64)
    x = x + 3.0  # an offset the unpenalised bias must absorb
    lambdas = [0.01, 1.0, 50.0]
    w, b = fewshot.ridge(x, y, lambdas)
    for i, lam in enumerate(lambdas):
        # min |x W + 1 b - y|^2 + lam |W|^2  ==  least squares on [[x, 1], [sqrt(lam) I, 0]] [W; b] = [y; 0]
        a = torch.cat([torch.cat([x, torch.ones(n, 1, dtype=x.dtype)], 1),
                       torch.cat([math.sqrt(lam) * torch.eye(d, dtype=x.dtype), torch.zeros(d, 1, dtype=x.dtype)], 1)])
        rhs = torch.cat([y, torch.zeros(d, 3, dtype=x.dtype)])
        solution = torch.linalg.lstsq(a, rhs).solution  # (d + 1, 3)
        torch.testing.assert_close(w[i], solution[:d], rtol=1e-8, atol=1e-9)
        torch.testing.assert_close(b[i], solution[d], rtol=1e-8, atol=1e-9)


def test_the_regulariser_is_the_one_best_on_held_out_images():
    train_x, train_y = clusters(20, 3, 8, 6.0, seed=3)
    val_x, val_y = clusters(100, 3, 8, 6.0, seed=3)
    shots = torch.cat([torch.arange(c * 20, c * 20 + 5) for c in range(3)])
    held = torch.cat([torch.arange(c * 20 + 5, c * 20 + 20) for c in range(3)])
    args = train_x[shots], train_y[shots], train_x[held], train_y[held]
    # With one regulariser offered and the held-out images as "validation", the score is its held-out accuracy.
    on_held = {lam: fewshot.probe_accuracy(*args, train_x[held], train_y[held], 3, lambdas=[lam])
               for lam in fewshot.LAMBDAS}
    assert len(set(on_held.values())) > 1  # the choice matters here
    best = max(on_held.values())
    chosen = max(lam for lam, acc in on_held.items() if acc == best)  # ties: the stronger regulariser
    expected = fewshot.probe_accuracy(*args, val_x, val_y, 3, lambdas=[chosen])
    assert fewshot.probe_accuracy(*args, val_x, val_y, 3) == expected


# ---- the draw ------------------------------------------------------------------------------------

def test_draw_is_stratified_repeatable_and_leaves_the_global_rng_alone():
    labels = torch.tensor([0] * 30 + [1] * 12 + [2] * 50)[torch.randperm(92, generator=torch.Generator())]
    before = global_rng_states()
    plans = fewshot.draws_for(labels, 3, shots=10, draws=3, seed=7, holdout=4)
    assert same_states(before, global_rng_states())
    again = fewshot.draws_for(labels, 3, shots=10, draws=3, seed=7, holdout=4)
    assert all(torch.equal(p, q) and torch.equal(h, g) for (p, h), (q, g) in zip(plans, again))
    other = fewshot.draws_for(labels, 3, shots=10, draws=3, seed=8, holdout=4)
    assert not all(torch.equal(p, q) for (p, _), (q, _) in zip(plans, other))
    assert not torch.equal(plans[0][0], plans[1][0])  # draws differ from one another
    for pool, held in plans:
        assert pool.shape == (3, 10) and (labels[pool] == torch.arange(3)[:, None]).all()  # k of each class
        assert torch.bincount(labels[held], minlength=3).tolist() == [4, 2, 4]  # class 1 has only 2 left
        assert len(set(pool.flatten().tolist()) | set(held.tolist())) == 30 + 10  # all distinct


def test_a_class_smaller_than_k_is_a_clear_error():
    labels = torch.tensor([0] * 30 + [1] * 5)
    with pytest.raises(ValueError, match="class 1 has 5 training images; 5-shot"):
        fewshot.draws_for(labels, 2, shots=5, draws=1, seed=0)


def test_evaluate_streams_frozen_features_and_restores_mode_and_rng():
    torch.manual_seed(0)
    model = ViT("micro", img_size=28, in_chans=1, num_classes=10, patch_size=7, width=32, depth=1, heads=2,
                mlp_dim=64, dropout=0.5)
    model.train()
    data = ImageDataModule("mnist5k", batch_size=256)
    data.setup()
    before = global_rng_states()
    scores = fewshot.evaluate(model, data, shots=(1, 5), draws=2)
    assert same_states(before, global_rng_states()) and model.training
    assert scores == fewshot.evaluate(model, data, shots=(1, 5), draws=2)  # eval mode: dropout off, repeatable
    # The same numbers from features of the whole training split, computed here in one pass.
    train_set, labels = data.unaugmented_train()
    model.eval()
    with torch.no_grad():
        x_train = model.forward_features(data.val_collate([train_set[i] for i in range(len(train_set))])[0])
        val_x, val_y = data.val_collate([data.val_set[i] for i in range(len(data.val_set))])
        x_val = model.forward_features(val_x)
    direct = fewshot.fewshot_accuracy(x_train, labels, x_val, val_y, 10, shots=(1, 5), draws=2)
    assert scores == pytest.approx(direct, abs=1e-6)
    assert 0.1 < scores["val/fewshot5"] <= 1.0


def test_mlp_head_runs_are_probed_at_pre_logits():
    torch.manual_seed(0)
    model = ViT("micro", img_size=28, in_chans=1, num_classes=10, patch_size=7, width=32, depth=1, heads=2,
                mlp_dim=64, head="mlp_tanh").eval()
    data = ImageDataModule("mnist5k", batch_size=256)
    data.setup()
    x = data.val_collate([data.val_set[i] for i in range(8)])[0]
    hidden = model.head[0]
    with torch.no_grad():
        expected = torch.tanh(model.forward_features(x) @ hidden.weight.T + hidden.bias)  # big_vision's pre_logits
        feats, _ = fewshot.extract(model, [(x, torch.zeros(8, dtype=torch.long))])
        assert torch.allclose(feats, expected, atol=1e-6)
        linear = ViT("micro", img_size=28, in_chans=1, num_classes=10, patch_size=7, width=32, depth=1, heads=2,
                     mlp_dim=64).eval()
        assert torch.equal(fewshot.extract(linear, [(x, torch.zeros(8, dtype=torch.long))])[0],
                           linear.forward_features(x))  # no hidden layer: the pooled vector


def test_big_vision_estimator_is_standardised_ridge_with_l2_1024():
    x, y = clusters(5, 4, 16, spread=8.0, seed=3)
    x = x * torch.linspace(0.1, 30, 16)  # features of very different scales: standardisation matters
    val_x, val_y = clusters(50, 4, 16, spread=8.0, seed=4)
    val_x = val_x * torch.linspace(0.1, 30, 16)
    got = fewshot.probe_accuracy(x, y, x[:0], y[:0], val_x, val_y, 4, estimator="big_vision")
    # Naive: standardise with the training mean and std, centre the targets, solve the normal equations.
    xd, vd = x.double(), val_x.double()
    mean, std = xd.mean(0), xd.std(0, unbiased=False)
    z = (xd - mean) / std
    t = 2.0 * torch.nn.functional.one_hot(y, 4).double() - 1.0
    w = torch.linalg.solve(z.T @ z + 1024.0 * torch.eye(16, dtype=torch.double), z.T @ (t - t.mean(0)))
    pred = (((vd - mean) / std) @ w + t.mean(0)).argmax(-1)
    assert got == pytest.approx(float((pred == val_y).double().mean()), abs=1e-6)
    with pytest.raises(ValueError, match="unknown few-shot estimator 'jax'; choose from: paper, big_vision"):
        fewshot.fewshot_accuracy(x, y, val_x, val_y, 4, estimator="jax")


# ---- during fit and afterwards -------------------------------------------------------------------

@pytest.mark.slow
def test_fit_records_fewshot_and_the_cli_recomputes_it(tmp_path, monkeypatch, capsys, only_record):
    monkeypatch.chdir(tmp_path)
    assert train.main(TINY) == 0
    path, record = only_record(tmp_path / "runs")
    assert record["status"] == "completed"
    recorded = {name: record["metrics"][name] for name in NAMES}
    for k in fewshot.SHOTS:
        mean, std = fewshot.metric_names(k)
        assert 0.0 < recorded[mean] <= 1.0 and recorded[std] >= 0.0
    with open(path.parent / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row["val/fewshot5"]]
    assert len(rows) == 1 and float(rows[0]["val/fewshot5"]) == pytest.approx(recorded["val/fewshot5"])

    # An old record without the numbers: `vit-ablate fewshot RUN_DIR` fills them in from last.ckpt.
    old = {**record, "metrics": {k: v for k, v in record["metrics"].items() if "fewshot" not in k}}
    path.write_text(json.dumps(old))
    capsys.readouterr()
    assert cli.main(["fewshot", str(path.parent)]) == 0
    assert f"updated {path}" in capsys.readouterr().out
    filled = json.loads(path.read_text())
    assert {name: filled["metrics"][name] for name in NAMES} == pytest.approx(recorded, abs=1e-6)
    assert "updated_at" in filled  # stamped, so a table made before copies the record again
    assert {k: v for k, v in filled.items() if k not in ("metrics", "updated_at")} == {
        k: v for k, v in old.items() if k != "metrics"}
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_fewshot_every_epoch_leaves_training_as_it_was(tmp_path, monkeypatch, only_record):
    monkeypatch.chdir(tmp_path)
    two = [*TINY, "--trainer.max_epochs=2", "--model.dropout=0.1", "--data.random_crop=true"]
    assert train.main([*two, "--run.fewshot_every=1", "--run.root=a"]) == 0
    assert train.main([*two, "--run.fewshot_shots=[]", "--run.root=b"]) == 0
    path_a, a = only_record(tmp_path / "a")
    _, b = only_record(tmp_path / "b")
    assert a["history"] == b["history"] and len(a["history"]) == 2
    assert "val/fewshot5" in a["metrics"] and not any("fewshot" in k for k in b["metrics"])
    with open(path_a.parent / "metrics.csv") as f:
        steps = [row["step"] for row in csv.DictReader(f) if row["val/fewshot1"]]
    assert steps == ["2", "4"]  # after each epoch (global steps); the end of fit is the second epoch's end


def test_bad_fewshot_options_fail_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, "--run.fewshot_shots=[0, 5]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.fewshot_shots" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_cli_missing_or_corrupt_checkpoint_is_one_line(tmp_path, capsys):
    assert cli.main(["fewshot", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"vit-ablate fewshot: no checkpoint at {tmp_path / 'nowhere'}"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.ckpt").write_bytes(b"not a checkpoint")
    (run / "results.json").write_text('{"metrics": {}}')
    assert cli.main(["fewshot", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vit-ablate fewshot: cannot load checkpoint {run / 'last.ckpt'}")
    assert (run / "results.json").read_text() == '{"metrics": {}}'  # nothing written
    (run / "results.json").write_text('{"metrics": ')
    assert cli.main(["fewshot", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vit-ablate fewshot: cannot read {run / 'results.json'}")


# ---- tables in the paper's own metric ------------------------------------------------------------

def test_table_builds_with_the_fewshot_metric(tmp_path, monkeypatch):
    enc = "model.pos_encoding"
    demo = Profile("demo", {"data.name": "mnist5k"}, ({enc: ["none", "learned_1d"]},), (0, 1), "test")
    ab = Ablation("fs", "few-shot", "Table 8", "finding", "val/acc_best", enc, None, {}, "note", {"demo": demo})
    values = {("none", 0): 0.31, ("none", 1): 0.35, ("learned_1d", 0): 0.52, ("learned_1d", 1): 0.56}
    for (cell, seed), value in values.items():
        run = tmp_path / "runs" / "fs" / "demo" / f"{cell}-s{seed}"
        run.mkdir(parents=True)
        record = {"schema": 1, "name": run.name, "ablation": "fs", "profile": "demo", "status": "completed",
                  "config": {"data.name": "mnist5k", "run.ablation": "fs", "run.profile": "demo", enc: cell,
                             "seed_everything": seed},
                  "metrics": {"val/acc": 0.9, "val/acc_best": 0.9, "val/fewshot5": value}, "history": [],
                  "compute": {}, "versions": {}, "wandb": None, "error": None,
                  "started_at": "2024-01-01T10:00:00", "finished_at": "2024-01-01T10:30:00"}
        (run / "results.json").write_text(json.dumps(record))
    monkeypatch.setattr(ablations, "load", lambda name, directory=None: ab)
    out = tmp_path / "out"
    assert table_cli.main(["fs", "--runs", str(tmp_path / "runs"), "--out", str(out),
                           "--metric", "val/fewshot5"]) == 0
    md = (out / "table.md").read_text()
    for cell in ("none", "learned_1d"):
        runs = [v for (c, _), v in values.items() if c == cell]
        assert f"{np.mean(runs):.4f} ± {np.std(runs, ddof=1):.4f}" in md
    assert "val/fewshot5" in md and "0.9000" not in md

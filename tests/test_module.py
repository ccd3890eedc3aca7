"""Classifier's optimizer: the learning rate at every step, and which parameters are decayed."""

import csv
import math

import pytest
from tiny import TINY_MODEL

from vit_lightning.commands.fit import main as train
from vit_lightning.run.module import Classifier, decay_groups

TINY = [*TINY_MODEL, "--trainer.limit_val_batches=1"]


def expected_lr(schedule: str, peak: float, warmup: int, total: int, step: int) -> float:
    """Linear warm-up reaching the peak at step warmup - 1, then the schedule's decay over the remaining steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    done = (step - warmup) / (total - warmup)
    return peak * {"cosine": (1 + math.cos(math.pi * done)) / 2, "linear": 1 - done, "constant": 1.0}[schedule]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_learning_rate_at_every_step(schedule, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # 2 epochs of 4 steps, warm-up half an epoch: 2 warm-up steps of 8
    argv = [*TINY, "--trainer.max_epochs=2", "--trainer.limit_train_batches=4", "--model.warmup_epochs=0.5",
            "--trainer.log_every_n_steps=1", f"--model.schedule={schedule}", "--model.lr=0.01"]
    assert train.main(argv) == 0
    [path] = tmp_path.glob("runs/*/*/*/metrics.csv")
    with path.open(newline="") as file:
        logged = [float(row["train/lr"]) for row in csv.DictReader(file) if row["train/lr"]]
    expected = [expected_lr(schedule, 0.01, 2, 8, step) for step in range(8)]
    assert logged == pytest.approx(expected, rel=1e-6)  # logged as float32


def test_weight_decay_groups_by_name():
    module = Classifier(
        variant="micro", img_size=28, in_chans=1, num_classes=10, patch_size=7, depth=2, width=32, heads=2,
        mlp_dim=64, pos_encoding="learned_2d", pos_injection="every_layer", head="mlp_tanh",
    )
    decay, no_decay = decay_groups(module.model, 0.05)
    names = {id(p): name for name, p in module.model.named_parameters()}
    decayed = sorted(names[id(p)] for p in decay["params"])
    matrices = [f"blocks.{i}.{m}.weight" for i in (0, 1) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
    assert decayed == sorted(["stem.proj.weight", *matrices, "head.0.weight", "head.2.weight"])
    # everything else: biases, norms, the [class] token and every block's 2-D position tables (matrices too)
    assert sorted(names[id(p)] for p in no_decay["params"]) == sorted(set(names.values()) - set(decayed))
    assert {f"pos.parts.{i}.{t}_table" for i in (0, 1) for t in "xy"} | {"pool.token"} <= set(names.values())
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)

"""The "uses position" metric: shuffled patches leave a position-free ViT's logits as they were and change an
encoded one's; val/acc_shuffled and val/shuffle_drop against a pixel-by-pixel shuffle; the fit option's errors."""

from __future__ import annotations

import csv

import pytest
import torch
from tiny import TINY_MODEL

from vit_lightning.analysis.evaluate import accuracy
from vit_lightning.analysis.shuffle import (
    ShuffledAccuracy,
    block_error,
    permutations,
    shuffle_blocks,
    shuffled_accuracy,
)
from vit_lightning.commands.fit import main as train
from vit_lightning.model import ViT


def naive_shuffle(x: torch.Tensor, block: int, perm: torch.Tensor) -> torch.Tensor:
    """Block i of the output (raster order) is block perm[i] of the input, copied block by block."""
    out, cols = torch.empty_like(x), x.shape[-1] // block
    for i, j in enumerate(perm.tolist()):
        (r, c), (sr, sc) = divmod(i, cols), divmod(j, cols)
        out[..., r * block:(r + 1) * block, c * block:(c + 1) * block] = \
            x[..., sr * block:(sr + 1) * block, sc * block:(sc + 1) * block]
    return out


def test_blocks_move_whole_and_to_where_the_permutation_says():
    x = torch.randn(2, 3, 8, 12)  # a 2 x 3 grid of 4 px blocks
    for perm in permutations(6):
        assert torch.equal(shuffle_blocks(x, 4, perm), naive_shuffle(x, 4, perm))


def test_permutations_are_fixed_and_never_the_identity():
    first, again = permutations(4, count=20), permutations(4, count=20)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # the same seed: the same shuffles in every run
    assert all(sorted(p.tolist()) == [0, 1, 2, 3] and p.tolist() != [0, 1, 2, 3] for p in first)
    assert permutations(1, count=2) == [torch.tensor([0])] * 2  # one block: nothing to move


def model(encoding: str, pooling: str = "cls") -> ViT:
    torch.manual_seed(0)
    vit = ViT("micro", img_size=28, in_chans=1, num_classes=10, patch_size=7, pos_encoding=encoding, pooling=pooling)
    torch.nn.init.normal_(vit.head.weight)  # the paper's zero head would give every image the same logits
    return vit.eval()


@pytest.mark.parametrize("pooling", ["cls", "gap"])
def test_without_an_encoding_the_logits_do_not_change(pooling):
    vit, x = model("none", pooling), torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        for perm in permutations(16):
            torch.testing.assert_close(vit(naive_shuffle(x, 7, perm)), vit(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("encoding", ["learned_1d", "relative_1d"])
def test_with_an_encoding_they_do(encoding):
    vit, x = model(encoding), torch.randn(4, 1, 28, 28)
    if encoding == "relative_1d":  # offset embeddings of a trained size: the 0.02 start moves logits little
        with torch.no_grad():
            for part in vit.pos.parts:
                part.table.normal_()
    with torch.no_grad():
        for perm in permutations(16):
            assert (vit(naive_shuffle(x, 7, perm)) - vit(x)).abs().max() > 1e-2


def test_the_shuffled_accuracy_is_the_mean_over_the_permutations():
    vit = model("learned_1d")
    with torch.no_grad():  # a table that matters as much as the content, as after training
        vit.pos.parts[0].table.normal_()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 1, 28, 28, generator=gen), torch.randint(0, 10, (6,), generator=gen)) for _ in range(3)]
    with torch.no_grad():  # labels the model gets right on the intact images half the time
        batches = [(x, torch.where(torch.arange(6) % 2 == 0, vit(x).argmax(-1), y)) for x, y in batches]
    got = shuffled_accuracy(vit, batches, 7, count=3)
    intact = accuracy(vit, batches)["val/acc"]
    shuffled = [accuracy(vit, [(naive_shuffle(x, 7, p), y) for x, y in batches])["val/acc"] for p in permutations(16, 3)]
    assert got["val/acc_shuffled"] == pytest.approx(sum(shuffled) / 3)
    assert got["val/shuffle_drop"] == pytest.approx(intact - sum(shuffled) / 3)
    assert got["val/shuffle_drop"] > 0  # the half it gets right by construction are not all right when shuffled


def test_images_that_are_not_whole_patches_are_refused():
    assert block_error((1, 1, 28, 28), 7) is None
    assert block_error((1, 1, 28, 30), 7) == "the image size (28, 30) is not a multiple of patch_size=7"
    with pytest.raises(ValueError, match="not a multiple of patch_size=5"):
        shuffled_accuracy(model("none"), [(torch.zeros(1, 1, 28, 28), torch.zeros(1, dtype=torch.long))], 5)


@pytest.mark.parametrize("count", [-1, True, 1.5])
def test_a_bad_permutation_count_is_one_line(count):
    with pytest.raises(ValueError, match=r"run.shuffle_perms must be a count of permutations >= 1 \(0: off\)"):
        ShuffledAccuracy(count)


@pytest.mark.slow
def test_fit_records_the_shuffled_accuracy_and_leaves_training_as_it_was(tmp_path, monkeypatch, only_record):
    monkeypatch.chdir(tmp_path)
    tiny = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
            "--run.fewshot_shots=[]", "--run.wandb=off", "--model.pos_encoding=learned_1d"]
    assert train.main([*tiny, "--run.root=a"]) == 0
    assert train.main([*tiny, "--run.root=b", "--run.shuffle_perms=0"]) == 0
    path, a = only_record(tmp_path / "a")
    _, b = only_record(tmp_path / "b")
    assert a["history"] == b["history"] and "val/acc_shuffled" not in b["metrics"]
    metrics = a["metrics"]
    assert 0.0 <= metrics["val/acc_shuffled"] <= 1.0
    # the intact top-1 of the same pass is the last epoch's val/acc (the same 2 batches, the same weights)
    assert metrics["val/shuffle_drop"] == pytest.approx(metrics["val/acc"] - metrics["val/acc_shuffled"], abs=1e-6)
    with open(path.parent / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("val/acc_shuffled")]
    assert len(rows) == 1 and float(rows[0]["val/shuffle_drop"]) == pytest.approx(metrics["val/shuffle_drop"])
    assert train.main([*tiny, "--run.root=c", "--run.shuffle_perms=-1"]) == 2  # one line, nothing trained
    assert not (tmp_path / "c").exists()

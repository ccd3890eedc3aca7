"""The epoch metrics a fit logs equal the same quantities computed directly from the data and the weights."""

import csv
import json

import pytest
import torch
import torch.nn.functional as F
from tiny import TINY_MODEL

from vit_lightning.commands.fit import main as train
from vit_lightning.data.datamodule import ImageDataModule
from vit_lightning.model.pooling import HEADS
from vit_lightning.run.module import Classifier

# lr ~ 0: the weights barely move in the epoch, so the epoch's training loss is the loss of the final
# weights over the whole training split, whatever the order of the batches. The head starts random
# (not zero), so the logits differ between classes.
ARGV = [*TINY_MODEL, "--data.batch_size=100", "--model.lr=1e-12", "--trainer.max_epochs=1",
        "--trainer.num_sanity_val_steps=2", "--trainer.log_every_n_steps=7"]


def evaluate(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, float]:
    """(mean loss, top-1, top-5) over every image, in one pass."""
    with torch.no_grad():
        logits = model(images)
    top5 = logits.topk(5, dim=1).indices
    return (F.cross_entropy(logits, labels).item(), (top5[:, 0] == labels).float().mean().item(),
            (top5 == labels[:, None]).any(dim=1).float().mean().item())


def random_head(dim: int, num_classes: int, init: str = "paper") -> torch.nn.Module:
    return torch.nn.Linear(dim, num_classes)


@pytest.mark.slow
def test_logged_epoch_metrics_equal_a_direct_computation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(HEADS, "linear", random_head)
    assert train.main([*ARGV, f"--run.root={tmp_path}"]) == 0
    [path] = tmp_path.glob("*/*/*/results.json")
    metrics = json.loads(path.read_text())["metrics"]
    module = Classifier(width=32, depth=1, heads=2, mlp_dim=64, patch_size=7, img_size=28, in_chans=1,
                           num_classes=10)
    module.load_state_dict(torch.load(path.parent / "last.ckpt", weights_only=True)["state_dict"])
    model = module.model.eval()
    data = ImageDataModule(batch_size=100)
    data.setup()
    for split in ("train", "val"):
        dataset = getattr(data, f"{split}_set")
        images, labels = data.val_collate([dataset[i] for i in range(len(dataset))])
        loss, acc, acc5 = evaluate(model, images, labels)
        assert abs(metrics[f"{split}/loss"] - loss) < 1e-4, split
        assert abs(metrics[f"{split}/acc"] - acc) <= 1 / len(labels), split
        if split == "val":
            assert metrics["val/acc5"] == acc5 and metrics["val/acc"] == acc
    # the per-step values are written on every 7th step, as Lightning writes them out
    rows = list(csv.DictReader((path.parent / "metrics.csv").open()))
    steps = [int(r["step"]) for r in rows if r.get("train/loss_step")]
    assert steps == list(range(6, 40, 7)) and all(r["train/lr"] for r in rows if r.get("train/loss_step"))

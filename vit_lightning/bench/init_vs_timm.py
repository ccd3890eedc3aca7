"""Our default ViT against timm's default ViT of the same size, in one plain training loop (same data, seeds).

`python -m vit_lightning.bench.init_vs_timm --epochs 3 --seeds 0 1` prints val accuracy per pairing.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from vit_lightning.data import ViTDataModule
from vit_lightning.model import ViT

SIZE = dict(img_size=28, in_chans=1, num_classes=10, patch_size=4)


def ours(pooling: str, pos: str, init: str) -> torch.nn.Module:
    return ViT("micro", pooling=pooling, pos_encoding=pos, init=init, **SIZE)


def timms(pooling: str, pos: str) -> torch.nn.Module:
    """timm's default init; `gap` as ours (LayerNorm on every token, then the mean: fc_norm off)."""
    return VisionTransformer(embed_dim=64, depth=4, num_heads=4, mlp_ratio=4.0, class_token=pooling == "cls",
                             global_pool="token" if pooling == "cls" else "avg", fc_norm=False,
                             pos_embed="learn" if pos == "learned_1d" else "none", **SIZE)


def train(model: torch.nn.Module, data: ViTDataModule, epochs: int, lr: float) -> float:
    """AdamW with a cosine schedule; val top-1 at the end."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * len(data.train_dataloader())
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps, pct_start=0.1)
    for _ in range(epochs):
        model.train()
        for x, y in data.train_dataloader():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        hits = [(model(x).argmax(-1) == y).float() for x, y in data.val_dataloader()]
    return float(torch.cat(hits).mean())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for pooling, pos in (("cls", "learned_1d"), ("cls", "none"), ("gap", "learned_1d")):
        scores = {"paper": [], "timm-init": [], "timm ViT": []}
        for seed in args.seeds:
            for name in scores:
                torch.manual_seed(seed)
                data = ViTDataModule("mnist5k", batch_size=128, num_workers=0)
                data.setup()
                model = timms(pooling, pos) if name == "timm ViT" else ours(pooling, pos, name.split("-")[0])
                scores[name].append(train(model, data, args.epochs, args.lr))
        line = ", ".join(f"{k} {sum(v) / len(v):.3f} {[round(a, 3) for a in v]}" for k, v in scores.items())
        print(f"{pooling}/{pos}: {line}", flush=True)


if __name__ == "__main__":
    main()

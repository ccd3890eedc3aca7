"""Our default ViT against timm's default ViT of the same size, in one plain training loop (same data, seeds).

`python -m vit_lightning.commands.bench.init_vs_timm [--epochs 10 --seeds 0 1 2]` prints, per pairing of pooling and
position encoding, the val accuracy of our ViT with the paper's init (the default), ours with timm's init,
and timm's `VisionTransformer` with its own default init, and whether ours is below timm's by more than
seed noise (Welch's t-test, one-sided, p < 0.05). One thread, batch 128, AdamW with a one-cycle schedule.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from scipy.stats import ttest_ind
from timm.models.vision_transformer import VisionTransformer

from vit_lightning.commands.bench.models import DEFAULT_ENCODING
from vit_lightning.core.parser import CommandParser
from vit_lightning.data.datamodule import ImageDataModule
from vit_lightning.model import ENCODINGS, ViT
from vit_lightning.model.position import NO_POSITION

SIZE = dict(img_size=28, in_chans=1, num_classes=10, patch_size=4)


def ours(pooling: str, pos: str, init: str) -> torch.nn.Module:
    return ViT("micro", pooling=pooling, pos_encoding=pos, init=init, **SIZE)


def timms(pooling: str, pos: str) -> torch.nn.Module:
    """timm's default init; `gap` as ours (LayerNorm on every token, then the mean: fc_norm off)."""
    return VisionTransformer(embed_dim=64, depth=4, num_heads=4, mlp_ratio=4.0, class_token=pooling == "cls",
                             global_pool="token" if pooling == "cls" else "avg", fc_norm=False,
                             pos_embed=ENCODINGS[pos].timm_pos_embed, **SIZE)


PAIRINGS = tuple((pooling, pos) for pooling in ("cls", "gap") for pos in (DEFAULT_ENCODING, NO_POSITION))


def train(model: torch.nn.Module, data: ImageDataModule, epochs: int, lr: float, batches: int | None = None) -> float:
    """AdamW with a one-cycle schedule; val top-1 at the end (`batches`: at most that many steps an epoch)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    per_epoch = min(len(data.train_dataloader()), batches or len(data.train_dataloader()))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * per_epoch, pct_start=0.1)
    for _ in range(epochs):
        model.train()
        for _, (x, y) in zip(range(per_epoch), data.train_dataloader()):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        hits = [(model(x).argmax(-1) == y).float() for x, y in data.val_dataloader()]
    return float(torch.cat(hits).mean())


def verdict(ours_: list[float], timm_: list[float]) -> str:
    """Whether ours is below timm's by more than seed noise (one-sided Welch test)."""
    if len(ours_) < 2:
        return "cannot tell (one seed)"
    p = float(ttest_ind(ours_, timm_, equal_var=False, alternative="less").pvalue)
    return f"ours below timm's (p={p:.3f})" if p < 0.05 else f"not below timm's (one-sided p={p:.2f})"


def main(argv=None) -> None:
    p = CommandParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batches", type=int, help="at most this many steps an epoch (quick checks)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"val top-1 after {args.epochs} epochs, seeds {args.seeds}: mean ± std [per seed]", flush=True)
    for pooling, pos in PAIRINGS:
        scores = {"paper": [], "timm-init": [], "timm ViT": []}
        for seed in args.seeds:
            for name in scores:
                torch.manual_seed(seed)
                data = ImageDataModule("mnist5k", batch_size=128, num_workers=0)
                data.setup()
                model = timms(pooling, pos) if name == "timm ViT" else ours(pooling, pos, name.split("-")[0])
                scores[name].append(train(model, data, args.epochs, args.lr, args.batches))
        line = ", ".join(f"{k} {statistics.fmean(v):.3f} ± {statistics.stdev(v) if len(v) > 1 else 0:.3f} "
                         f"{[round(a, 3) for a in v]}" for k, v in scores.items())
        print(f"{pooling}/{pos}: {line}; paper init: {verdict(scores['paper'], scores['timm ViT'])}", flush=True)


if __name__ == "__main__":
    main()

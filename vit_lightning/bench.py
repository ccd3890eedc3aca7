"""`vit-ablate bench`: training and inference throughput of our backbone against timm's, measured
in one run on the same config, plus the relative cost of every position encoding and pooling."""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch

from vit_lightning.model import ENCODINGS, VARIANTS, ViT


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vit-ablate bench", description=__doc__)
    p.add_argument("--variant", default="Ti", choices=list(VARIANTS))
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds; candidates alternate within a round")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--precision", default="32", choices=["32", "bf16"])
    p.add_argument("--no-timm", action="store_true", help="skip the timm comparison")
    p.add_argument("--encodings", action="store_true", help="also time every position encoding and pooling")
    return p.parse_args(argv)


def candidates(args) -> dict[str, torch.nn.Module]:
    """Models to compare, all with the same sizes; the first is the baseline of the ratios."""
    common = dict(img_size=args.img_size, patch_size=args.patch_size, num_classes=1000)
    models = {"ours learned_1d/cls": ViT(args.variant, **common)}
    if not args.no_timm:
        try:
            from timm.models.vision_transformer import VisionTransformer
        except ImportError:
            print("timm is not installed: `pip install timm` to compare against it")
        else:
            depth, width, mlp_dim, heads = VARIANTS[args.variant]
            models["timm VisionTransformer"] = VisionTransformer(
                embed_dim=width, depth=depth, num_heads=heads, mlp_ratio=mlp_dim / width, **common)
    if args.encodings:
        for enc in ENCODINGS:
            if enc != "learned_1d":
                models[f"ours {enc}/cls"] = ViT(args.variant, pos_encoding=enc, **common)
        models["ours learned_1d/gap"] = ViT(args.variant, pooling="gap", **common)
    return models


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(model, x, y, train: bool, steps: int, autocast) -> float:
    """Throughput of `steps` training steps (forward, backward, SGD update) or inference passes."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3) if train else None
    model.train(train)
    _sync(x.device)
    start = time.perf_counter()
    for _ in range(steps):
        with autocast, torch.set_grad_enabled(train):
            logits = model(x)
        if train:
            torch.nn.functional.cross_entropy(logits.float(), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    _sync(x.device)
    return steps * x.shape[0] / (time.perf_counter() - start)


def main(argv: list[str]) -> int:
    args = parse(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    bf16 = args.precision == "bf16"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    torch.manual_seed(0)
    models = {name: m.to(device) for name, m in candidates(args).items()}
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device)
    y = torch.randint(0, 1000, (args.batch_size,), device=device)
    print(f"device={device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"threads={torch.get_num_threads()}, variant={args.variant}/{args.patch_size}, img={args.img_size}, "
          f"batch={args.batch_size}, precision={args.precision}, torch={torch.__version__}")
    results = {name: {"train": [], "infer": []} for name in models}
    for model in models.values():  # warm-up: allocator, kernels, autotuning
        images_per_second(model, x, y, True, 1, autocast)
    for _ in range(args.rounds):  # alternate candidates so drift in machine load hits all alike
        for name, model in models.items():
            for mode in ("train", "infer"):
                results[name][mode].append(images_per_second(model, x, y, mode == "train", args.steps, autocast))
    baseline = next(iter(models))
    base = {mode: statistics.median(results[baseline][mode]) for mode in ("train", "infer")}
    print(f"{'model':<26}{'params':>12}{'train img/s':>14}{'ratio':>8}{'infer img/s':>14}{'ratio':>8}")
    for name, model in models.items():
        train, infer = (statistics.median(results[name][m]) for m in ("train", "infer"))
        params = sum(p.numel() for p in model.parameters())
        print(f"{name:<26}{params:>12,}{train:>14.1f}{train / base['train']:>8.2f}{infer:>14.1f}{infer / base['infer']:>8.2f}")
    print(f"ratios are throughput relative to '{baseline}' (medians of {args.rounds} alternating rounds)")
    return 0

"""[class] token vs global average pooling across learning rates: Figure 9 (appendix D.3).

Expected: both poolings reach about the same accuracy, but at different learning rates
(the paper: CLS is good at lr 8e-4; GAP is poor at 8e-4 and good at 3e-4). Compare each
pooling at its own best learning rate, never at a shared one.

Run:  vit-ablate sweep cls_vs_gap                        # demo: mnist5k, micro ViT, CPU
      vit-ablate sweep cls_vs_gap --profile imagenet     # ViT-B/16, 3 seeds per cell
      vit-ablate table cls_vs_gap
"""

from vit_lightning.ablation import METRIC, Ablation, profile

POOL, LR = "model.pooling", "model.lr"
# log-spaced learning rates, each grid spans >= 30x around the profile's usual lr
LRS = {
    "demo": [0.0003, 0.001, 0.003, 0.01, 0.03],
    "cifar10": [0.0001, 0.0003, 0.001, 0.003, 0.01],
    "imagenet": [0.0001, 0.0003, 0.0008, 0.002, 0.005],
}


def grid(name: str) -> dict:
    """Pooling x the profile's learning rates."""
    return {POOL: ["cls", "gap"], LR: LRS[name]}


ABLATION = Ablation(
    name="cls_vs_gap",
    title="Class token vs global average pooling across learning rates",
    source="Figure 9 (appendix D.3)",
    finding="CLS and GAP reach the same accuracy, but GAP needs a lower learning rate (3e-4 vs 8e-4).",
    metric=METRIC,
    rows=POOL,
    cols=LR,
    reference={},
    reference_note="Figure 9 plots ViT-B/16 ImageNet 5-shot linear top-1 over training: CLS at lr 8e-4 and "
    "GAP at lr 3e-4 end alike, GAP at lr 8e-4 ends lower (curves only, no cell values)",
    profiles={
        "demo": profile("demo", grid("demo"), description="mnist5k, micro ViT/7, CPU"),
        "cifar10": profile("cifar10", grid("cifar10"), description="CIFAR-10, ViT-S/4"),
        "imagenet": profile("imagenet", grid("imagenet"), description="ImageNet, ViT-B/16"),
    },
)

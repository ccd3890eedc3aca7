"""Patch size: Figure 8 / Table 5 of Dosovitskiy et al. 2021 (ViT-B/32 vs B/16, L/16 vs L/14 ...).

Expected: smaller patches mean longer sequences, more compute and higher accuracy; the
gain per halving of the patch shrinks. Read accuracy together with GFLOPs per image.

Run:  vit-ablate sweep patch_size                        # demo: 28 px mnist5k, patches 2/4/7/14
      vit-ablate sweep patch_size --profile cifar10      # 32 px, patches 2/4/8
      vit-ablate table patch_size
"""

from vit_lightning.ablation import METRIC, Ablation, profile

PATCH = "model.patch_size"
SIZES = {"demo": [2, 4, 7, 14], "cifar10": [2, 4, 8], "imagenet": [8, 16, 32]}  # each divides the image

ABLATION = Ablation(
    name="patch_size",
    title="Patch size: sequence length vs accuracy and compute",
    source="Figure 8 / Table 5",
    finding="Smaller patches (longer sequences) give higher accuracy at more compute.",
    metric=METRIC,
    rows=PATCH,
    cols=None,
    layout="compute",
    reference={32: 0.8073, 16: 0.8415},
    reference_note="ViT-B/32 and ViT-B/16 pre-trained 7 epochs on JFT-300M, ImageNet fine-tuned top-1 (Table 5)",
    profiles={
        name: profile(name, {PATCH: SIZES[name]}, description=desc)
        for name, desc in [
            ("demo", "mnist5k, micro ViT, CPU"),
            ("cifar10", "CIFAR-10, ViT-S"),
            ("imagenet", "ImageNet, ViT-B"),
        ]
    },
)

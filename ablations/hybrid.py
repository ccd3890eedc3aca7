"""Patch stem vs hybrid ResNet stem: section 3.1 and Figure 5 of Dosovitskiy et al. 2021.

The hybrid feeds the feature map of a BiT-style ResNet (weight-standardized convs,
GroupNorm) to the transformer as 1x1 "patches". Expected: at small compute the hybrid is
slightly better than the plain patch stem; the gap vanishes for larger models.

Run:  vit-ablate sweep hybrid                            # demo: mnist5k, micro ViT, CPU
      vit-ablate sweep hybrid --profile imagenet         # R50+ViT-B/16 vs ViT-B/16
      vit-ablate table hybrid
"""

from vit_lightning.ablation import METRIC, Ablation, profile

STEM = "model.stem"
# Both stems give the same token grid, as in the paper (R50's stride 16 <-> patch 16): the patch
# stem's patch size equals the ResNet's stride (4 x 2^(stages-1)); each stem ignores the other's options.
FIXED = {
    "demo": {"model.patch_size": 7, "model.hybrid_layers": [1, 1], "model.hybrid_width": 32},  # 4x4 tokens at 28 px
    "cifar10": {"model.patch_size": 8, "model.hybrid_layers": [3, 4]},  # 4x4 tokens at 32 px
    "imagenet": {"model.patch_size": 16, "model.hybrid_layers": [3, 4, 9]},  # 14x14 tokens at 224 px
}

ABLATION = Ablation(
    name="hybrid",
    naming=1,  # the naming rule its committed runs were named by: their names and sweep YAMLs stay
    title="Patch stem vs hybrid ResNet stem",
    source="Section 3.1, Figure 5",
    finding="Hybrids beat plain ViT slightly at small compute budgets; the difference vanishes for larger models.",
    metric=METRIC,
    rows=STEM,
    cols=None,
    layout="grid",
    baseline={STEM: "patch"},  # the paper's claim at small compute: the hybrid beats it
    expected_verdicts={"": {"hybrid": "beats patch"}},
    reference={},
    reference_note="Figure 5 (transfer accuracy vs pre-training compute) is qualitative here: no cell values",
    profiles={
        name: profile(name, {STEM: ["patch", "hybrid"]}, fixed=FIXED[name], description=desc)
        for name, desc in [
            ("demo", "mnist5k, micro ViT/7 vs 2-stage ResNet (stride 8) + micro ViT, CPU"),
            ("cifar10", "CIFAR-10, ViT-S/8 vs 2-stage R50 (stride 8) + ViT-S"),
            ("imagenet", "ImageNet, ViT-B/16 vs R50+ViT-B/16"),
        ]
    },
)

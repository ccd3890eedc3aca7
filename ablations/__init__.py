"""The paper's ablations, one module each, installed as `vit_lightning.ablations` (see README, "Add an ablation")."""

"""The paper's analysis figures for trained runs: `vit-ablate viz` and the figures `vit-ablate table` writes."""

from vit_lightning.commands.viz.ablation import write_ablation_figures

__all__ = ["write_ablation_figures"]

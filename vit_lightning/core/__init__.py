"""The ground floor: the vocabulary every part shares (record names, option checks, atomic writes, a run's
identity, the demo defaults, the plot style, the floor rule); it imports nothing of vit_lightning above it."""

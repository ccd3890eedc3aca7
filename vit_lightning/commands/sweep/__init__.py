"""Sweeps: ablation -> W&B sweep YAML; a local backend (W&B grid/random semantics) and a W&B agents backend."""

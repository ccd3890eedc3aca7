"""`vit-ablate docs`: the reference pages of the documentation site, generated from the registries."""

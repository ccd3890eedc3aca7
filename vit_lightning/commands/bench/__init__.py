"""`vit-ablate bench` and `vit-ablate gpu-check`: what training costs on a device, and whether the data keeps up."""

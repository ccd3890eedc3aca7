"""PI-resize (FlexiViT, Beyer et al., CVPR 2023): the patch-embedding kernel for another patch size.

Resizing a p x p patch to q x q with bilinear interpolation is a linear map B, (q*q, p*p). The kernel w'
that gives the resized patch the token the original kernel w gave the original patch solves
<x, w> = <B x, w'> for every patch x, that is B^T w' = w. PI-resize takes the least-norm least-squares
solution w' = pinv(B^T) w: exact when q >= p (B^T then has full row rank), the closest in the least-squares
sense when q < p. The resize is antialiased, as `jax.image.resize` in big_vision's FlexiViT and timm's
`resample_patch_embed`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resize_matrix(old: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """B, (new_h * new_w, old_h * old_w) float64: column j is the bilinear resize of the j-th one-pixel patch."""
    basis = torch.eye(old[0] * old[1], dtype=torch.float64).reshape(-1, 1, *old)  # (p*p, 1, p, p)
    resized = F.interpolate(basis, size=new, mode="bilinear", align_corners=False, antialias=True)
    return resized.reshape(old[0] * old[1], -1).T


def pseudo_inverse_t(b: torch.Tensor) -> torch.Tensor:
    """pinv(B^T) from the SVD of B^T, dropping singular values below the float64 noise floor."""
    u, s, vh = torch.linalg.svd(b.T, full_matrices=False)  # B^T = U diag(s) V^H
    keep = s > s.max() * max(b.shape) * torch.finfo(s.dtype).eps
    return vh[keep].T @ torch.diag(1.0 / s[keep]) @ u[:, keep].T  # (q*q, p*p)


@torch.no_grad()
def pi_resize(weight: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(D, C, p, p) patch-embedding kernel -> (D, C, *size), PI-resized; the same tensor when the size is its own."""
    old = tuple(weight.shape[-2:])
    if old == tuple(size):
        return weight
    inverse = pseudo_inverse_t(resize_matrix(old, tuple(size)))  # (q*q, p*p)
    flat = weight.reshape(-1, old[0] * old[1]).double()  # (D*C, p*p)
    return (flat @ inverse.T).reshape(*weight.shape[:2], *size).to(weight.dtype)

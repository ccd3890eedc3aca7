"""Poolings (tokens -> one image vector) and classification heads.

Every pooling is built as `Pooling(dim, heads)`, owns its prefix tokens (`num_prefix`, `prepend`)
and the final LayerNorm of the encoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vit_lightning.model.layers import Mlp


class ClassToken(nn.Module):
    """The paper's [class] token: y = LN(z_L^0)."""

    num_prefix = 1

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, dim) * 1e-6)
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def prepend(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)  # (B, 1+N, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x[:, 0])


class GlobalAvgPool(nn.Module):
    """Global average pooling of the patch tokens, then LayerNorm (no [class] token)."""

    num_prefix = 0

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def prepend(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.mean(dim=1))


class AttentionPool(nn.Module):
    """Multihead attention pooling: a learned probe attends over the normalised tokens, then an MLP."""

    num_prefix = 0

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.probe = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.q, self.kv, self.proj = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)

    def prepend(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        x = self.norm(x)
        q = self.q(self.probe.to(x.dtype)).view(1, 1, self.heads, -1).transpose(1, 2).expand(b, -1, -1, -1)
        k, v = self.kv(x).view(b, t, 2, self.heads, -1).permute(2, 0, 3, 1, 4)  # (B, h, T, hd)
        y = self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, d))  # (B, D)
        return y + self.mlp(self.mlp_norm(y))


POOLINGS: dict[str, type[nn.Module]] = {"cls": ClassToken, "gap": GlobalAvgPool, "map": AttentionPool}


def linear_head(dim: int, num_classes: int) -> nn.Module:
    """A zero-initialised linear classifier, as the paper attaches for fine-tuning."""
    head = nn.Linear(dim, num_classes)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def mlp_tanh_head(dim: int, num_classes: int) -> nn.Module:
    """The paper's pre-training head: one hidden layer with tanh."""
    return nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), linear_head(dim, num_classes))


HEADS = {"linear": linear_head, "mlp_tanh": mlp_tanh_head}

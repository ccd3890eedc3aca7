"""Poolings (tokens -> one image vector) and classification heads.

Every pooling is built as `Pooling(dim, heads)`, owns its prefix tokens (`num_prefix`, `prepend`)
and the final LayerNorm of the encoder. The two global average poolings differ in where that
LayerNorm sits:

- `gap` is the paper's (vit_jax `models_vit.py`, big_vision `vit.py`): LayerNorm on every token,
  then the mean over the patch tokens;
- `gap_fcnorm` is timm's `global_pool='avg'` with `fc_norm`: the mean first, then LayerNorm;
- `gap_fcnorm_cls` is `gap_fcnorm` with a [class] token that joins the encoder but not the mean
  (timm's `class_token=True, global_pool='avg'`, as MAE and BEiT fine-tune).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vit_lightning.model.layers import Mlp, init_dense, lecun_normal_


def _prepend(token: nn.Parameter, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)  # (B, 1+N, D)


class ClassToken(nn.Module):
    """The paper's [class] token: y = LN(z_L^0)."""

    num_prefix = 1

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, dim) * 1e-6)
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def init_weights(self, init: str) -> None:
        """`paper`: a zero token (vit_jax, big_vision); `timm` keeps normal(1e-6)."""
        if init == "paper":
            nn.init.zeros_(self.token)

    def prepend(self, x: torch.Tensor) -> torch.Tensor:
        return _prepend(self.token, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x[:, 0])


class GlobalAvgPool(nn.Module):
    """The paper's global average pooling: LayerNorm on every token, then the mean (no [class] token)."""

    num_prefix = 0

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def init_weights(self, init: str) -> None:
        """Nothing to initialise beyond the LayerNorm's ones and zeros."""

    def prepend(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # mean(LN(x) * g + b) = mean(LN(x)) * g + b: the affine on the pooled vector, not on every token
        norm = self.norm
        pooled = F.layer_norm(x, norm.normalized_shape, None, None, norm.eps).mean(dim=1)  # (B, N, D) -> (B, D)
        return pooled * norm.weight + norm.bias


class MeanThenNorm(GlobalAvgPool):
    """timm's average pooling with `fc_norm`: the mean of the patch tokens, then LayerNorm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x[:, self.num_prefix :].mean(dim=1))


class MeanThenNormWithToken(MeanThenNorm):
    """`MeanThenNorm` over the patch tokens, with a [class] token that attends but is not averaged."""

    num_prefix = 1

    def __init__(self, dim: int, heads: int):
        super().__init__(dim, heads)
        self.token = nn.Parameter(torch.randn(1, 1, dim) * 1e-6)

    init_weights = ClassToken.init_weights

    def prepend(self, x: torch.Tensor) -> torch.Tensor:
        return _prepend(self.token, x)


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

    def init_weights(self, init: str) -> None:
        """`paper`: big_vision's MAPHead (xavier probe and kernels, q/k/v each (D, D), zero biases); `timm`: 0.02."""
        if init == "timm":
            self.apply(init_dense)
            return
        bound = math.sqrt(6.0 / (1 + self.probe.shape[-1]))  # flax xavier on (1, 1, D): fan_in 1, fan_out D
        nn.init.uniform_(self.probe, -bound, bound)
        for kernel in (self.q.weight, *self.kv.weight.data.chunk(2, dim=0), self.proj.weight):
            nn.init.xavier_uniform_(kernel)
        for layer in (self.q, self.kv, self.proj):
            nn.init.zeros_(layer.bias)
        self.mlp.init_paper()

    def prepend(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        x = self.norm(x)
        q = self.q(self.probe.to(x.dtype)).view(1, 1, self.heads, -1).transpose(1, 2).expand(b, -1, -1, -1)
        k, v = self.kv(x).view(b, t, 2, self.heads, -1).permute(2, 0, 3, 1, 4)  # (B, h, T, hd)
        y = self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, d))  # (B, D)
        return y + self.mlp(self.mlp_norm(y))


class Registers(nn.Module):
    """Register tokens (Darcet et al., "Vision Transformers Need Registers", ICLR 2024): `count` learned tokens
    placed before the patches (after the pooling's [class] token), with no position, dropped before the pooling."""

    def __init__(self, dim: int, count: int):
        super().__init__()
        self.count = count
        # normal(1e-6) under either init, as DINOv2 and timm: equal registers would stay equal (no position)
        self.tokens = nn.Parameter(torch.randn(1, count, dim) * 1e-6) if count else None

    def prepend(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) patch tokens -> (B, R + N, D)."""
        return x if self.tokens is None else torch.cat([self.tokens.expand(x.shape[0], -1, -1).to(x.dtype), x], 1)

    def drop(self, x: torch.Tensor, after: int) -> torch.Tensor:
        """(B, P + R + N, D) -> (B, P + N, D): the `after` leading tokens and the patches, without the registers."""
        return x if self.tokens is None else torch.cat([x[:, :after], x[:, after + self.count:]], 1)


POOLINGS: dict[str, type[nn.Module]] = {
    "cls": ClassToken,
    "gap": GlobalAvgPool,
    "gap_fcnorm": MeanThenNorm,
    "gap_fcnorm_cls": MeanThenNormWithToken,
    "map": AttentionPool,
}


def linear_head(dim: int, num_classes: int, init: str = "paper") -> nn.Module:
    """A zero-initialised linear classifier, as the paper attaches for fine-tuning."""
    head = nn.Linear(dim, num_classes)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def mlp_tanh_head(dim: int, num_classes: int, init: str = "paper") -> nn.Module:
    """The paper's pre-training head: a tanh hidden layer (`pre_logits`: lecun_normal in vit_jax), a zero classifier."""
    hidden = nn.Linear(dim, dim)
    if init == "timm":
        init_dense(hidden)
    else:
        lecun_normal_(hidden.weight)
        nn.init.zeros_(hidden.bias)
    return nn.Sequential(hidden, nn.Tanh(), linear_head(dim, num_classes))


HEADS = {"linear": linear_head, "mlp_tanh": mlp_tanh_head}

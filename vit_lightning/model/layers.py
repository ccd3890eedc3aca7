"""The pre-LN Transformer encoder block of the paper: z + MSA(LN(z)), then z + MLP(LN(z)).

Two later options, both off by default: layer scale (DeiT-III, CaiT: z + diag(gamma) MSA(LN(z)), gamma a learned
per-channel vector starting at `layer_scale`; timm's `init_values` / `ls1`, `ls2`, the same as its Eva's `gamma_1`,
`gamma_2`) and qk-norm (ViT-22B: LayerNorm of each head's queries and keys before the dot product; timm's
`qk_norm=True`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

INITS = ("paper", "timm")


class Attention(nn.Module):
    """Multi-head self-attention through scaled_dot_product_attention, with an optional logits bias and an
    optional rotation of queries and keys (`rotary.rotate(q, k)`, RoPE) after the qk-norm.

    Set `keep_probs = True` to compute the softmax explicitly and keep it in `probs` for analysis;
    the outputs are the same numbers as the fused path.
    """

    def __init__(self, dim: int, heads: int, attn_dropout: float = 0.0, dropout: float = 0.0, qk_norm: bool = False):
        super().__init__()
        self.heads, self.attn_dropout = heads, attn_dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        norm = (lambda: nn.LayerNorm(dim // heads, eps=1e-6)) if qk_norm else nn.Identity
        self.q_norm, self.k_norm = norm(), norm()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(dropout)
        self.keep_probs, self.probs = False, None

    def init_paper(self) -> None:
        """flax's separate query, key and value kernels, each (D, D) xavier_uniform; out kernel xavier; zero biases."""
        for kernel in self.qkv.weight.data.chunk(3, dim=0):  # three (D, D) views of the fused (3D, D)
            nn.init.xavier_uniform_(kernel)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.qkv.bias)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor, relative: nn.Module | None = None, rotary: nn.Module | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # (B, h, T, hd)
        q, k = self.q_norm(q), self.k_norm(k)  # identities unless qk_norm
        if rotary is not None:
            q, k = rotary.rotate(q, k)
        bias = relative(q) if relative is not None else None  # (B|1, h, T, T) or None
        if self.keep_probs:
            logits = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
            self.probs = (logits if bias is None else logits + bias).softmax(dim=-1)
            out = self.probs @ v
        else:
            p = self.attn_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, t, d)))


@contextmanager
def keeping_attention(blocks):
    """Within the block, every block's attention computes its softmax explicitly and keeps it in `attn.probs`."""
    blocks = list(blocks)
    for block in blocks:
        block.attn.keep_probs = True
    try:
        yield
    finally:
        for block in blocks:
            block.attn.keep_probs, block.attn.probs = False, None


class Mlp(nn.Module):
    """Two dense layers with a GELU between them."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def init_paper(self) -> None:
        """vit_jax's MlpBlock: xavier_uniform kernels, biases normal(1e-6)."""
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.normal_(fc.bias, std=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(F.gelu(self.fc1(x)))))


class LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch, every channel starting at `value` (DeiT-III, CaiT)."""

    def __init__(self, dim: int, value: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(value)))  # (D,), whatever model.init says

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma.to(x.dtype)


def layer_scale(dim: int, value: float | None) -> nn.Module:
    """A LayerScale starting at `value`, or the identity when `value` is None (off)."""
    return nn.Identity() if value is None else LayerScale(dim, value)


class DropPath(nn.Module):
    """Stochastic depth: in training, drop a residual branch for a whole sample with probability `rate`."""

    def __init__(self, rate: float = 0.0):
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1.0 - self.rate)
        return x * keep / (1.0 - self.rate)  # unbiased: the expected output is the branch


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Per-block stochastic depth rising linearly from 0 to `rate` at the last block (as Swin and DeiT)."""
    return [rate * i / max(1, depth - 1) for i in range(depth)]


class Block(nn.Module):
    """One encoder layer (eq. 2-3 of the paper)."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float = 0.0, attn_dropout: float = 0.0,
                 drop_path: float = 0.0, scale: float | None = None, qk_norm: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, attn_dropout, dropout, qk_norm)
        self.ls1 = layer_scale(dim, scale)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, mlp_dim, dropout)
        self.ls2 = layer_scale(dim, scale)
        self.drop_path = DropPath(drop_path)

    def init_weights(self, init: str) -> None:
        """`paper` (vit_jax / big_vision) or `timm` (trunc_normal(0.02)); LayerNorms stay ones and zeros."""
        if init == "timm":
            self.apply(init_dense)
        else:
            self.attn.init_paper()
            self.mlp.init_paper()

    def forward(self, x: torch.Tensor, relative: nn.Module | None = None, rotary: nn.Module | None = None) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x), relative, rotary)))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


def init_dense(module: nn.Module) -> None:
    """Truncated-normal dense weights with zero biases; convs keep PyTorch's fan-in init."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def lecun_normal_(weight: torch.Tensor) -> torch.Tensor:
    """jax's lecun_normal: a truncated normal (at 2 std) whose std after truncation is sqrt(1 / fan_in)."""
    fan_in = weight[0].numel()  # (out, in, *kernel): in * kernel area
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # undo the std lost to truncation at +-2
    return nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)

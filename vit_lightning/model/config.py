"""ViTConfig: every option of the backbone as plain values, checked once, here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from vit_lightning.model.pooling import HEADS, POOLINGS
from vit_lightning.model.position import ENCODINGS, INJECTIONS
from vit_lightning.model.stems import STEMS

# name: (layers, width, MLP size, heads), the paper's Table 1 plus Ti/S (DeiT) and a CPU demo size
VARIANTS: dict[str, tuple[int, int, int, int]] = {
    "micro": (4, 64, 256, 4),
    "Ti": (12, 192, 768, 3),
    "S": (12, 384, 1536, 6),
    "B": (12, 768, 3072, 12),
    "L": (24, 1024, 4096, 16),
    "H": (32, 1280, 5120, 16),
}


def check_choice(option: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {option}={value!r}; choose from: {', '.join(map(str, choices))}")


@dataclass
class ViTConfig:
    """Plain options of a ViT; `width/depth/heads/mlp_dim` default to the variant's.

    Every field is also a `vit-ablate fit` option, `--model.<field>`, with this docstring as its help.

    Args:
        variant: size preset (VARIANTS: micro is the CPU demo size, Ti, S, B, L, H the paper's and DeiT's).
        img_size: input side in pixels, or (height, width); `fit` sets it from the data.
        in_chans: input channels; `fit` sets it from the data.
        num_classes: output classes; `fit` sets it from the data.
        patch_size: side of the square patches (the hybrid stem's stride replaces it).
        width: token width D, overriding the variant's.
        depth: number of encoder blocks, overriding the variant's.
        heads: attention heads, overriding the variant's; must divide width.
        mlp_dim: hidden size of the blocks' MLP, overriding the variant's.
        pos_encoding: position encoding, a name in position.ENCODINGS.
        pos_injection: where the encoding enters (stem, every_layer, every_layer_shared), as the encoding allows.
        pooling: tokens to one vector, a name in POOLINGS: cls ([class] token), gap (the paper's: final
            LayerNorm on every token, then the mean), gap_fcnorm (timm's: mean, then LayerNorm),
            gap_fcnorm_cls (timm's avg pooling with a class token left out of the mean), map (attention).
        stem: patch, or hybrid (a BiT ResNet of stages `hybrid_layers`, root width `hybrid_width`).
        hybrid_layers: bottleneck blocks per ResNet stage of the hybrid stem.
        hybrid_width: root width of the hybrid stem's ResNet (a multiple of 32).
        head: classifier on the pooled vector, a name in HEADS.
        dropout: dropout after the position encoding and in the blocks' MLP and attention output.
        attn_dropout: dropout on the attention probabilities.
    """

    variant: str = "micro"
    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    patch_size: int = 16
    width: int | None = None
    depth: int | None = None
    heads: int | None = None
    mlp_dim: int | None = None
    pos_encoding: str = "learned_1d"
    pos_injection: str = "stem"
    pooling: str = "cls"
    stem: str = "patch"
    hybrid_layers: tuple[int, ...] = field(default=(3, 4, 9))
    hybrid_width: int = 64
    head: str = "linear"
    dropout: float = 0.0
    attn_dropout: float = 0.0

    def __post_init__(self):
        check_choice("variant", self.variant, VARIANTS)
        check_choice("pos_encoding", self.pos_encoding, ENCODINGS)
        check_choice("pos_injection", self.pos_injection, INJECTIONS)
        check_choice("pooling", self.pooling, POOLINGS)
        check_choice("stem", self.stem, STEMS)
        check_choice("head", self.head, HEADS)
        allowed = ENCODINGS[self.pos_encoding].injections
        if self.pos_injection not in allowed:
            raise ValueError(
                f"pos_injection={self.pos_injection!r} is not allowed with pos_encoding={self.pos_encoding!r}; "
                f"allowed: {', '.join(allowed)}"
            )
        depth, width, mlp_dim, heads = VARIANTS[self.variant]
        self.depth = self.depth or depth
        self.width = self.width or width
        self.mlp_dim = self.mlp_dim or mlp_dim
        self.heads = self.heads or heads
        self.hybrid_layers = tuple(self.hybrid_layers)
        if isinstance(self.img_size, (list, tuple)):
            self.img_size = tuple(self.img_size) if self.img_size[0] != self.img_size[1] else self.img_size[0]
        for name in ("img_size", "in_chans", "num_classes", "patch_size", "width", "depth", "heads", "mlp_dim"):
            value = getattr(self, name)
            if min(value if isinstance(value, tuple) else (value,)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.width % self.heads:
            divisors = [h for h in range(1, self.width + 1) if self.width % h == 0]
            raise ValueError(f"heads={self.heads} does not divide width={self.width}; valid heads: {divisors}")
        if self.stem == "hybrid" and (not self.hybrid_layers or min(self.hybrid_layers) < 1 or self.hybrid_width % 32):
            raise ValueError(
                f"hybrid stem needs hybrid_layers of positive block counts and hybrid_width a multiple of 32, "
                f"got hybrid_layers={list(self.hybrid_layers)}, hybrid_width={self.hybrid_width}"
            )
        if not 0.0 <= self.dropout < 1.0 or not 0.0 <= self.attn_dropout < 1.0:
            raise ValueError(f"dropout and attn_dropout must be in [0, 1), got {self.dropout}, {self.attn_dropout}")

    @property
    def img_hw(self) -> tuple[int, int]:
        return self.img_size if isinstance(self.img_size, tuple) else (self.img_size, self.img_size)

    def to_dict(self) -> dict:
        """Plain JSON-able values (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

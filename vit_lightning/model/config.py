"""ViTConfig: every option of the backbone as plain values, checked once, here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from vit_lightning.model.layers import INITS
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

ARCHS = ("vit", "swin")

# Swin name: (width C of stage 1, blocks per stage, heads per stage); the Swin paper's section 3.3 plus a CPU
# demo size (two stages: 14x14 then 7x7 tokens for 28x28 digits in patches of 2)
SWIN_VARIANTS: dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]] = {
    "micro": (32, (2, 2), (2, 4)),
    "T": (96, (2, 2, 6, 2), (3, 6, 12, 24)),
    "S": (96, (2, 2, 18, 2), (3, 6, 12, 24)),
    "B": (128, (2, 2, 18, 2), (4, 8, 16, 32)),
    "L": (192, (2, 2, 18, 2), (6, 12, 24, 48)),
}

# Swin's position choices (its Table 4): name -> (absolute table after the patch embedding, relative bias)
SWIN_ENCODINGS: dict[str, tuple[bool, bool]] = {
    "none": (False, False),
    "learned_1d": (True, False),
    "relative_bias_2d": (False, True),
    "learned_1d+relative_bias_2d": (True, True),
}

# what None means for an option whose natural default differs by architecture
ARCH_DEFAULTS = {
    "vit": {"pooling": "cls", "pos_encoding": "learned_1d", "patch_size": 16},
    "swin": {"pooling": "gap", "pos_encoding": "relative_bias_2d", "patch_size": 4},
}
# options of one architecture only, with the value that means "not used"
VIT_ONLY = {"depth": None, "heads": None, "mlp_dim": None, "stem": "patch", "pos_injection": "stem",
            "hybrid_layers": (3, 4, 9), "hybrid_width": 64,
            "init": "paper",  # Swin initialises as the Swin paper does (swin.init_swin), whatever the ViT's init
            "reg_tokens": 0, "pos_embed_class": True}
SWIN_ONLY = {"window_size": 7, "shift": True}


def check_choice(option: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {option}={value!r}; choose from: {', '.join(map(str, choices))}")


@dataclass
class ViTConfig:
    """Plain options of a ViT; `width/depth/heads/mlp_dim` default to the variant's.

    `arch` chooses the backbone: `vit` (ViT) or `swin` (Swin, see model/swin.py). Options of one
    architecture only are refused for the other in one line.

    Every field is also a `vit-ablate fit` option, `--model.<field>`, with this docstring as its help.

    Args:
        arch: vit or swin.
        variant: size preset (VARIANTS: micro is the CPU demo size, Ti, S, B, L, H the paper's and DeiT's;
            for swin SWIN_VARIANTS: micro, T, S, B, L).
        img_size: input side in pixels, or (height, width); `fit` sets it from the data.
        in_chans: input channels; `fit` sets it from the data.
        num_classes: output classes; `fit` sets it from the data.
        patch_size: side of the square patches (default 16; swin: 4; `fit`: the demo's, 7 or for swin 2; the hybrid
            stem's stride replaces it).
        width: token width D (Swin: C of the first stage), overriding the variant's.
        depth: number of encoder blocks, overriding the variant's.
        heads: attention heads, overriding the variant's; must divide width.
        mlp_dim: hidden size of the blocks' MLP, overriding the variant's.
        pos_encoding: position encoding, a name in position.ENCODINGS (default learned_1d); for swin a name in
            SWIN_ENCODINGS (default relative_bias_2d).
        pos_injection: where the encoding enters (stem, every_layer, every_layer_shared), as the encoding allows.
        pooling: tokens to one vector (default cls; swin: gap only), a name in POOLINGS: cls ([class] token), gap (the paper's: final
            LayerNorm on every token, then the mean), gap_fcnorm (timm's: mean, then LayerNorm),
            gap_fcnorm_cls (timm's avg pooling with a class token left out of the mean), map (attention).
        stem: patch, or hybrid (a BiT ResNet of stages `hybrid_layers`, root width `hybrid_width`).
        hybrid_layers: bottleneck blocks per ResNet stage of the hybrid stem.
        hybrid_width: root width of the hybrid stem's ResNet (a multiple of 32).
        head: classifier on the pooled vector, a name in HEADS.
        dropout: dropout after the position encoding and in the blocks' MLP and attention output.
        attn_dropout: dropout on the attention probabilities.
        drop_path: stochastic depth: the largest rate, reached by the last block (rates rise linearly from 0).
        window_size: swin: side M of the attention windows (a window larger than a stage's map shrinks to it).
        shift: swin: shift every second block's windows by M // 2 (false: the Swin paper's "w/o shifting").
        init: initialisation, paper (vit_jax / big_vision: xavier_uniform dense kernels, lecun_normal patch
            embedding and pre_logits, zero classifier) or timm (trunc_normal(0.02), for parity with timm weights).
        layer_scale: DeiT-III's layer scale: the initial value of a learned per-channel scale on every residual
            branch (e.g. 1e-5; timm's init_values); off (None) by default.
        reg_tokens: register tokens (Darcet et al. 2024): learned tokens after the [class] token, without a
            position, left out of the pooling, the few-shot features and the figures; 0 by default (vit only).
        qk_norm: LayerNorm of every head's queries and keys before their dot product (ViT-22B; timm's qk_norm).
        pos_embed_class: true: the learned_1d table has a row for the [class] token (the paper); false: only the
            patches have one (DeiT-III, timm's no_embed_class); vit only.
    """

    arch: str = "vit"
    variant: str = "micro"
    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    patch_size: int | None = None
    width: int | None = None
    depth: int | None = None
    heads: int | None = None
    mlp_dim: int | None = None
    pos_encoding: str | None = None
    pos_injection: str = "stem"
    pooling: str | None = None
    stem: str = "patch"
    hybrid_layers: tuple[int, ...] = field(default=(3, 4, 9))
    hybrid_width: int = 64
    head: str = "linear"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    window_size: int = 7
    shift: bool = True
    init: str = "paper"
    # since the paper (DeiT-III, registers, ViT-22B), off by default; checked in _check_since_paper
    layer_scale: float | None = None
    reg_tokens: int = 0
    qk_norm: bool = False
    pos_embed_class: bool = True

    def __post_init__(self):
        check_choice("arch", self.arch, ARCHS)
        for name, value in ARCH_DEFAULTS[self.arch].items():
            setattr(self, name, value if getattr(self, name) is None else getattr(self, name))
        if self.arch == "swin":
            self._check_swin()
            return
        self._check_only(SWIN_ONLY, "swin")
        check_choice("variant", self.variant, VARIANTS)
        check_choice("pos_encoding", self.pos_encoding, ENCODINGS)
        check_choice("pos_injection", self.pos_injection, INJECTIONS)
        check_choice("pooling", self.pooling, POOLINGS)
        check_choice("stem", self.stem, STEMS)
        check_choice("head", self.head, HEADS)
        check_choice("init", self.init, INITS)
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
        self._check_rates()
        self._check_since_paper()

    def _check_since_paper(self) -> None:
        """layer_scale, reg_tokens, qk_norm, pos_embed_class: values, and where they apply."""
        if self.layer_scale is not None and not self.layer_scale > 0:
            raise ValueError(f"layer_scale must be a positive initial value (or None: off), got {self.layer_scale!r}")
        if isinstance(self.reg_tokens, bool) or not isinstance(self.reg_tokens, int) or self.reg_tokens < 0:
            raise ValueError(f"reg_tokens must be a count >= 0, got {self.reg_tokens!r}")
        if self.arch == "vit" and not self.pos_embed_class:
            if not POOLINGS[self.pooling].num_prefix:
                raise ValueError(f"pos_embed_class=false leaves the [class] token out of the position table, but "
                                 f"pooling={self.pooling!r} has no [class] token")
            if not ENCODINGS[self.pos_encoding].prefix_rows:
                raise ValueError(f"pos_embed_class=false: pos_encoding={self.pos_encoding!r} gives the [class] token "
                                 "no position anyway; only learned_1d has a [class] row to leave out")

    def _check_only(self, options: dict, arch: str) -> None:
        for name, unused in options.items():
            value = getattr(self, name)
            if (tuple(value) if isinstance(value, list) else value) != unused:
                raise ValueError(f"model.{name}={value!r} applies to arch={arch} only, not arch={self.arch}")

    def _check_rates(self) -> None:
        rates = {"dropout": self.dropout, "attn_dropout": self.attn_dropout, "drop_path": self.drop_path}
        if not all(0.0 <= r < 1.0 for r in rates.values()):
            raise ValueError(f"dropout, attn_dropout and drop_path must be in [0, 1), got {rates}")

    def _check_swin(self) -> None:
        """Swin's options: its presets, patch stem, final LayerNorm + average pooling, Table 4's encodings."""
        self._check_only(VIT_ONLY, "vit")
        check_choice("variant", self.variant, SWIN_VARIANTS)
        check_choice("pos_encoding", self.pos_encoding, SWIN_ENCODINGS)
        check_choice("pooling (arch=swin)", self.pooling, ("gap",))
        check_choice("head", self.head, HEADS)
        self.hybrid_layers = tuple(self.hybrid_layers)
        width, _, heads = SWIN_VARIANTS[self.variant]
        self.width = self.width or width
        if isinstance(self.img_size, (list, tuple)):
            self.img_size = tuple(self.img_size) if self.img_size[0] != self.img_size[1] else self.img_size[0]
        for name in ("img_size", "in_chans", "num_classes", "patch_size", "width", "window_size"):
            value = getattr(self, name)
            if min(value if isinstance(value, tuple) else (value,)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.width % heads[0]:
            raise ValueError(f"width={self.width} must be a multiple of {heads[0]} (stage 1 heads of Swin-{self.variant})")
        self._check_rates()
        self._check_since_paper()

    @property
    def img_hw(self) -> tuple[int, int]:
        return self.img_size if isinstance(self.img_size, tuple) else (self.img_size, self.img_size)

    def to_dict(self) -> dict:
        """Plain JSON-able values (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

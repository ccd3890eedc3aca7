"""ViTConfig: a backbone's options as plain values (the shared ones and its family's own), checked once, here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from vit_lightning.bookkeeping import check_choice, number_in, span
from vit_lightning.model.family import DEFAULT_ARCH, FAMILIES, family_options, unread_error
from vit_lightning.model.pooling import HEADS
from vit_lightning.model.position import ENCODING_OPTIONS

MAX_REG_TOKENS = 1024  # registers: 4 to 16 in their paper; far more only fills memory (attention is quadratic in them)
MAX_LAYER_SCALE = 10.0  # layer scale's initial value: 1e-6 to 1e-1 in DeiT-III and timm


@dataclass
class SharedOptions:
    """Plain options of a backbone; `width/depth/heads/mlp_dim` default to the variant's.

    `arch` chooses the backbone family (family.FAMILIES, see model/swin.py). An option that only other families
    read is refused in one line unless it keeps its default. A family's own options (family.Family.options, such
    as the Swin's window) are declared and checked by the family; ViTConfig holds both.

    Every field is also a `vit-ablate fit` option, `--model.<field>`, with this docstring as its help.

    Args:
        arch: the backbone family.
        variant: size preset (vit: micro is the CPU demo size, Ti, S, B, L, H the paper's and DeiT's;
            swin: micro, T, S, B, L).
        img_size: input side in pixels, or (height, width); `fit` sets it from the data.
        in_chans: input channels; `fit` sets it from the data.
        num_classes: output classes; `fit` sets it from the data.
        patch_size: side of the square patches (default 16; swin: 4; `fit`: the demo's, 7 or for swin 2; the hybrid
            stem's stride replaces it).
        width: token width D (Swin: C of the first stage), overriding the variant's.
        depth: number of encoder blocks, overriding the variant's.
        heads: attention heads, overriding the variant's; must divide width.
        mlp_dim: hidden size of the blocks' MLP, overriding the variant's.
        pos_encoding: position encoding (default: the family's, learned_1d for vit, relative_bias_2d for swin).
        relative_scale: relative_1d only: its q.r logits divided by sqrt(head_dim) (sqrt_d, as the content
            logits) or unscaled (none); the paper leaves it open.
        pos_injection: where the encoding enters (stem, every_layer, every_layer_shared), as the encoding allows.
        pooling: tokens to one vector (default cls; swin: gap only): cls ([class] token), gap (the paper's: final
            LayerNorm on every token, then the mean), gap_fcnorm (timm's: mean, then LayerNorm),
            gap_fcnorm_cls (timm's avg pooling with a class token left out of the mean), map (attention).
        stem: patch, or hybrid (a BiT ResNet of stages `hybrid_layers`, root width `hybrid_width`).
        hybrid_layers: bottleneck blocks per ResNet stage of the hybrid stem.
        hybrid_width: root width of the hybrid stem's ResNet (a multiple of 32).
        head: classifier on the pooled vector.
        dropout: dropout after the position encoding and in the blocks' MLP and attention output.
        attn_dropout: dropout on the attention probabilities.
        drop_path: stochastic depth: the largest rate, reached by the last block (rates rise linearly from 0).
        init: initialisation, paper (vit_jax / big_vision: xavier_uniform dense kernels, lecun_normal patch
            embedding and pre_logits, zero classifier) or timm (trunc_normal(0.02), for parity with timm weights);
            default paper for vit, timm for swin (the Swin paper's own init; paper there is a fan-in-scaled deviation).
        layer_scale: DeiT-III's layer scale: the initial value of a learned per-channel scale on every residual
            branch (e.g. 1e-5; timm's init_values); off (None) by default.
        reg_tokens: register tokens (Darcet et al. 2024): learned tokens after the [class] token, without a
            position, left out of the pooling, the few-shot features and the figures; 0 by default (vit only).
        qk_norm: LayerNorm of every head's queries and keys before their dot product (ViT-22B; timm's qk_norm).
        pos_embed_class: true: the learned_1d table has a row for the [class] token (the paper); false: only the
            patches have one (DeiT-III, timm's no_embed_class); vit only.
        rope_theta: RoPE's base frequency theta (pair k of the hd/4 per axis turns at theta^(-k/(hd/4)) radians per
            coordinate unit); None: NAVER's, 100 for rope_axial, 10 for rope_mixed (its start); RoPE encodings only.
        rope_coords: the (x, y) a patch gets, which decides what a larger grid means: patch (column and row index:
            a larger grid extrapolates to new positions; NAVER's RoPE-ViT and timm's naver_in1k models), ref_grid
            (indices rescaled to span the grid the model was built for: a larger grid interpolates; EVA-02, timm's
            ref_feat_shape), normalized (patch centres in [-1, 1] on either axis, turned by 2 pi per unit:
            interpolates; DINOv3); RoPE encodings only.
        peg_padding: PEG's border: zeros (CPVT's; the zero border is what tells a patch where it is) or circular
            (the grid wraps around: neighbourhood mixing without absolute position, a control); peg only.
    """

    arch: str = DEFAULT_ARCH
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
    relative_scale: str = ENCODING_OPTIONS["relative_scale"]
    pooling: str | None = None
    stem: str = "patch"
    hybrid_layers: tuple[int, ...] = field(default=(3, 4, 9))
    hybrid_width: int = 64
    head: str = "linear"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    init: str | None = None
    # since the paper (DeiT-III, registers, ViT-22B), off by default
    layer_scale: float | None = None
    reg_tokens: int = 0
    qk_norm: bool = False
    pos_embed_class: bool = True
    rope_theta: float | None = None
    rope_coords: str = "patch"
    peg_padding: str = ENCODING_OPTIONS["peg_padding"]

    def __post_init__(self):
        """Checked by ViTConfig, which holds the family's own options too."""


class ViTConfig(SharedOptions):
    """A backbone's options: the shared ones (SharedOptions' fields) and its family's own (`Family.options`)."""

    def __init__(self, **options):
        names = family_options()
        self._given = {name: options.pop(name) for name in list(options) if name in names}  # family options
        super().__init__(**options)

    def __post_init__(self):
        check_choice("arch", self.arch, FAMILIES)
        family = FAMILIES[self.arch]
        for name, value in family.defaults.items():
            setattr(self, name, value if getattr(self, name) is None else getattr(self, name))
        if error := unread_error(self.arch, {**self.shared(), **self._given}):
            raise ValueError(error)
        for name, option in family.options.items():  # its own options, checked by family.check
            setattr(self, name, self._given.get(name, option.default))
        check_choice("variant", self.variant, family.variants)
        self._check_encoding(family)
        check_choice("head", self.head, HEADS)
        self.hybrid_layers = tuple(self.hybrid_layers)
        if isinstance(self.img_size, (list, tuple)):
            self.img_size = tuple(self.img_size) if self.img_size[0] != self.img_size[1] else self.img_size[0]
        self._check_since_paper()
        family.check(self)
        rates = {"dropout": self.dropout, "attn_dropout": self.attn_dropout, "drop_path": self.drop_path}
        if not all(0.0 <= r < 1.0 for r in rates.values()):
            raise ValueError(f"dropout, attn_dropout and drop_path must be in [0, 1), got {rates}")

    def _check_encoding(self, family) -> None:
        """A known pos_encoding of another family only is refused naming the families that take it."""
        others = [f.name for f in FAMILIES.values() if self.pos_encoding in f.encodings]
        if self.pos_encoding not in family.encodings and others:
            raise ValueError(f"pos_encoding={self.pos_encoding!r} applies to arch={', '.join(others)} only, not "
                             f"arch={self.arch} (see README); choose from: {', '.join(family.encodings)}")
        check_choice("pos_encoding", self.pos_encoding, family.encodings)

    def _check_since_paper(self) -> None:
        """layer_scale and reg_tokens values (where they apply: the families' `reads` and checks)."""
        if self.layer_scale is not None and not number_in(self.layer_scale, 0, MAX_LAYER_SCALE, low_open=True):
            raise ValueError(f"layer_scale must be a positive initial value, a finite number in "
                             f"{span(0, MAX_LAYER_SCALE, low_open=True)} (or None: off), got {self.layer_scale!r}")
        if not number_in(self.reg_tokens, 0, MAX_REG_TOKENS, integer=True):  # before any memory is allocated
            raise ValueError(f"reg_tokens must be a count >= 0 and at most {MAX_REG_TOKENS} (every token adds a row "
                             f"and a column to every attention map), got {self.reg_tokens!r}")

    def check_positive(self, *names: str) -> None:
        """Each named option is a positive integer (or a pair of them)."""
        for name in names:
            value = getattr(self, name)
            if not all(number_in(v, 1, 2**31, integer=True) for v in (value if isinstance(value, tuple) else (value,))):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def img_hw(self) -> tuple[int, int]:
        return self.img_size if isinstance(self.img_size, tuple) else (self.img_size, self.img_size)

    def shared(self) -> dict:
        """The shared options (SharedOptions' fields) by name."""
        return {f.name: getattr(self, f.name) for f in fields(SharedOptions)}

    def to_dict(self) -> dict:
        """Plain JSON-able values, the family's own options included (tuples become lists)."""
        own = {name: getattr(self, name) for name in FAMILIES[self.arch].options}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in {**asdict(self), **own}.items()}


def option_names() -> set[str]:
    """Every backbone option a checkpoint's hyperparameters may hold: the shared ones and every family's own."""
    return {f.name for f in fields(SharedOptions)} | set(family_options())

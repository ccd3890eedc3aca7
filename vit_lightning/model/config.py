"""ModelConfig: a backbone's options as plain values (the shared ones and its family's own), checked once, here.

ViTConfig is its earlier name, kept as an alias: the options serve every family.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from vit_lightning.core.checks import check_choice, number_in, range_error, span
from vit_lightning.model.family import DEFAULT_ARCH, FAMILIES, family_options, unread_error
from vit_lightning.model.pooling import HEADS

MAX_LAYER_SCALE = 10.0  # layer scale's initial value: 1e-6 to 1e-1 in DeiT-III and timm
# shared options every family reads (the contract: its family and size, the images it takes, the classes it tells);
# a family declares which of the others it reads (Family.reads)
CONTRACT_OPTIONS = ("arch", "variant", "img_size", "in_chans", "num_classes")


@dataclass
class SharedOptions:
    """The options shared by the backbone families: each reads CONTRACT_OPTIONS and those it declares (Family.reads);
    `width` defaults to the variant's.

    `arch` chooses the backbone family (family.FAMILIES). A family's own options (family.Family.options: the ViT's
    stem, injection, sizes, registers and encoding options; the Swin's window) are declared by the family;
    ModelConfig holds both, and refuses in one line an option of another family set away from its default, and a
    shared option the family does not read (Family.reads) set away from its default.

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
        pos_encoding: position encoding (default: the family's, learned_1d for vit, relative_bias_2d for swin).
        pooling: tokens to one vector (default cls; swin: gap only): cls ([class] token), gap (the paper's: final
            LayerNorm on every token, then the mean), gap_fcnorm (timm's: mean, then LayerNorm),
            gap_fcnorm_cls (timm's avg pooling with a class token left out of the mean), map (attention).
        head: classifier on the pooled vector.
        dropout: dropout after the position encoding and in the blocks' MLP and attention output.
        attn_dropout: dropout on the attention probabilities.
        drop_path: stochastic depth: the largest rate, reached by the last block (rates rise linearly from 0).
        init: initialisation, paper (vit_jax / big_vision: xavier_uniform dense kernels, lecun_normal patch
            embedding and pre_logits, zero classifier) or timm (trunc_normal(0.02), for parity with timm weights);
            default paper for vit, timm for swin (the Swin paper's own init; paper there is a fan-in-scaled deviation).
        layer_scale: DeiT-III's layer scale: the initial value of a learned per-channel scale on every residual
            branch (e.g. 1e-5; timm's init_values); off (None) by default.
        qk_norm: LayerNorm of every head's queries and keys before their dot product (ViT-22B; timm's qk_norm).
    """

    arch: str = DEFAULT_ARCH
    variant: str = "micro"
    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    patch_size: int | None = None
    width: int | None = None
    pos_encoding: str | None = None
    pooling: str | None = None
    head: str = "linear"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    init: str | None = None
    # since the paper (DeiT-III, ViT-22B), off by default
    layer_scale: float | None = None
    qk_norm: bool = False

    def __post_init__(self):
        """Checked by ModelConfig, which holds the family's own options too."""


class ModelConfig(SharedOptions):
    """A backbone's options: the shared ones (SharedOptions' fields) and its family's own (`Family.options`)."""

    def __init__(self, **options):
        names = family_options()
        self._given = {name: options.pop(name) for name in list(options) if name in names}  # family options
        super().__init__(**options)

    def __post_init__(self):
        check_choice("model.arch", self.arch, FAMILIES)
        family = FAMILIES[self.arch]
        for name, value in family.defaults.items():
            setattr(self, name, value if getattr(self, name) is None else getattr(self, name))
        if error := unread_error(self.arch, {**self.shared(), **self._given}) or unread_shared_error(self):
            raise ValueError(error)
        for name, option in family.options.items():  # its own options: choices here, the rest by family.check
            setattr(self, name, self._given.get(name, option.default))
            if option.choices:
                check_choice(f"model.{name}", getattr(self, name), option.choices)
        check_choice("model.variant", self.variant, family.variants)
        self._check_encoding(family)
        check_choice("model.head", self.head, HEADS)
        if isinstance(self.img_size, (list, tuple)):
            self.img_size = tuple(self.img_size) if self.img_size[0] != self.img_size[1] else self.img_size[0]
        self._check_layer_scale()
        family.check(self)
        for name in ("dropout", "attn_dropout", "drop_path"):
            if error := range_error(f"model.{name}", getattr(self, name), 0, 1, high_open=True, what="a rate"):
                raise ValueError(error)

    def _check_encoding(self, family) -> None:
        """A known pos_encoding of another family only is refused naming the families that take it."""
        others = [f.name for f in FAMILIES.values() if self.pos_encoding in f.encodings]
        if self.pos_encoding not in family.encodings and others:
            raise ValueError(f"model.pos_encoding={self.pos_encoding!r} applies to arch={', '.join(others)} only, not "
                             f"arch={self.arch} (see README); choose from: {', '.join(family.encodings)}")
        check_choice("model.pos_encoding", self.pos_encoding, family.encodings)

    def _check_layer_scale(self) -> None:
        if self.layer_scale is not None and not number_in(self.layer_scale, 0, MAX_LAYER_SCALE, low_open=True):
            raise ValueError(f"model.layer_scale must be a positive initial value, a finite number in "
                             f"{span(0, MAX_LAYER_SCALE, low_open=True)} (or None: off), got {self.layer_scale!r}")

    def check_positive(self, *names: str) -> None:
        """Each named option is a positive integer (or a pair of them)."""
        for name in names:
            value = getattr(self, name)
            if not all(number_in(v, 1, 2**31, integer=True) for v in (value if isinstance(value, tuple) else (value,))):
                raise ValueError(f"model.{name} must be a positive integer, got {value!r}")

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


ViTConfig = ModelConfig  # its earlier name (alias): the options of every family, not the ViT's only


def unread_shared_error(cfg: ModelConfig) -> str | None:
    """A shared option set away from its default (the family's, else SharedOptions') on a family that does not read
    it, in one line naming the options the family reads; or None."""
    family = FAMILIES[cfg.arch]
    shared = [f for f in fields(SharedOptions) if f.name not in CONTRACT_OPTIONS]
    if unknown := sorted(family.reads - {f.name for f in shared}):
        return (f"arch={cfg.arch} declares it reads {', '.join(unknown)}, not shared options beyond the contract's; "
                f"choose from: {', '.join(f.name for f in shared)}")
    for option in shared:
        value, default = getattr(cfg, option.name), family.defaults.get(option.name, option.default)
        if option.name not in family.reads and (tuple(value) if isinstance(value, list) else value) != default:
            reads = [f"model.{f.name}" for f in shared if f.name in family.reads] + [f"model.{n}" for n in family.options]
            return (f"model.{option.name}={value!r} is not read by arch={cfg.arch}; it reads: "
                    f"{', '.join(reads) or 'none of the options beyond ' + ', '.join(CONTRACT_OPTIONS)}")
    return None


def option_names() -> set[str]:
    """Every backbone option a checkpoint's hyperparameters may hold: the shared ones and every family's own."""
    return {f.name for f in fields(SharedOptions)} | set(family_options())

"""Position encodings: absolute tables added to tokens, relative ones added to attention logits, conditional ones
computed from the tokens on their grid between blocks.

Every encoding is built as `Encoding(dim, heads, grid, num_prefix)`, declares where it may be
injected, knows the (H, W) patch grid it was built for, and resamples itself to another grid.
Prefix tokens (the [class] token, then any register tokens) sit before the patch tokens; only
`learned_1d` gives the [class] token a position, as the paper's E_pos in R^{(N+1) x D} (unless
`pos_embed_class=false`, DeiT-III's choice); register tokens never get one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vit_lightning.core.checks import check_choice
from vit_lightning.model import rope


def _interp_1d(table: torch.Tensor, size: int, mode: str = "bicubic") -> torch.Tensor:
    """Resample a (L, C) table to (size, C): linear (for bicubic and bilinear: one axis) or nearest."""
    if table.shape[0] == size:
        return table
    if mode == "nearest":
        return F.interpolate(table.T[None], size=size, mode="nearest")[0].T
    return F.interpolate(table.T[None], size=size, mode="linear", align_corners=False)[0].T


def _interp_2d(table: torch.Tensor, size: tuple[int, int], mode: str = "bicubic") -> torch.Tensor:
    """Resample a (C, H, W) table to (C, *size): bicubic, bilinear or nearest, pixel centres aligned.

    Antialiased, as timm's `resample_abs_pos_embed` and big_vision's `jax.image.resize` (their bicubic is Keys'
    a = -0.5, PyTorch's antialiased one; shrinking a table averages instead of skipping rows).
    """
    if tuple(table.shape[-2:]) == tuple(size):
        return table
    smooth = mode != "nearest"
    return F.interpolate(table[None], size=tuple(size), mode=mode, align_corners=False if smooth else None,
                         antialias=smooth)[0]


# How a resize meets a learned table (model.pos_resample): interpolated, or KEEP: every trained entry kept as it was
# (bit for bit; a learned table top-left aligned, as RoPE's patch coordinates count from the top-left patch) and the
# entries beyond the trained range copying the nearest trained edge (Swin's offsets clamped)
KEEP = "keep"


def edge_index(size: int, trained: int, centred: bool = False) -> torch.Tensor:
    """(size,) indices into a trained axis of `trained` entries: entry i -> min(i, trained - 1); `centred`: both axes
    hold offsets -(n-1)/2 .. (n-1)/2 (odd n), each new offset -> the trained index of that offset clamped to range."""
    if not centred:
        return torch.arange(size).clamp(max=trained - 1)
    half, new_half = (trained - 1) // 2, (size - 1) // 2
    return (torch.arange(size) - new_half).clamp(-half, half) + half


# Where an encoding can enter the network: added to the tokens once, before the first block (the
# paper's default), or at the input of every block with a table per block or one table shared.
INJECTIONS = ("stem", "every_layer", "every_layer_shared")


class Encoding(nn.Module):
    """Base of the position encodings; a subclass must declare `injections`, its allowed subset of INJECTIONS.

    Absolute encodings implement `embedding() -> (T, D) | None`; relative ones set `relative = True`
    and map (B, h, T, hd) queries to (B|1, h, T, T) logits in `forward`; rotary ones set `rotary = True`
    and turn (B, h, T, hd) queries and keys in `rotate(q, k)` (one copy per block, like relative ones), with
    `table` the absolute encoding added at the stem beside them (NoEncoding: none); conditional ones set
    `conditional = True` and map (B, T, D) tokens to tokens in `forward`. `reads` names the ViTConfig options
    the encoding takes as keywords besides the common four.
    """

    relative: bool = False
    rotary: bool = False
    conditional: bool = False  # a module on the token grid: maps (B, T, D) tokens to tokens between blocks
    min_depth: int = 1  # the fewest encoder blocks it needs to act at all
    reads: tuple[str, ...] = ()
    prefix_rows: bool = False  # whether the table has rows of its own for prefix tokens (else they get zeros)
    layered: bool = False  # built as kind(..., layer=i, depth=depth): its copy in block i knows its depth
    # what `resample` does, for the run record: formatted with the interpolation `mode` and the `options` it reads
    on_resize: str = "resampled to the new grid"
    on_keep: str | None = None  # what `resample` does with mode KEEP, when not the same as on_resize
    figure_note: str = ""  # why a run's figures have no similarity of its table to draw (none: there is one)
    timm_pos_embed: str | None = None  # timm VisionTransformer's `pos_embed` that builds the same thing, if any
    injections: tuple[str, ...]

    @classmethod
    def absolute(cls) -> bool:
        """Added to the tokens (a table or nothing); the other kinds act inside the encoder."""
        return not (cls.relative or cls.rotary or cls.conditional)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        allowed = getattr(cls, "injections", None)
        if not isinstance(allowed, tuple) or not allowed or not set(allowed) <= set(INJECTIONS):
            raise TypeError(
                f"position encoding {cls.__name__} must declare injections = a non-empty tuple from "
                f"{', '.join(INJECTIONS)}; got {allowed!r}"
            )


    def facts(self) -> dict:
        """What a run record keeps about this encoding as built (its grid's consequences); none by default."""
        return {}

    @classmethod
    def on_shuffle(cls, options: dict) -> str:
        """What else than position a shuffle of the patches changes for this encoding with these options, for the
        tables beside its shuffle drop; '': the drop measures the use of position alone."""
        return ""


class NoEncoding(Encoding):
    """No position information at all: the encoder sees a bag of patches."""

    injections = ("stem",)  # nothing to inject anywhere else
    on_resize = "nothing to resample"
    figure_note = "the model has no position embedding, so there is no similarity to draw"
    timm_pos_embed = "none"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int):
        super().__init__()
        self.grid = tuple(grid)

    def embedding(self) -> torch.Tensor | None:
        return None

    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        self.grid = tuple(grid)


class Learned1d(Encoding):
    """The paper's default: one learned vector per token in raster order (class token included)."""

    injections, prefix_rows = INJECTIONS, True
    on_resize = "patch rows interpolated as a 2-D image ({mode}), prefix rows kept"
    on_keep = ("patch rows kept where the trained grid reaches (top-left aligned), rows and columns beyond it copying "
               "the trained edge; prefix rows kept")
    timm_pos_embed = "learn"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int):
        super().__init__()
        self.grid, self.num_prefix = tuple(grid), num_prefix
        self.table = nn.Parameter(torch.randn(num_prefix + grid[0] * grid[1], dim) * 0.02)  # (P+N, D)

    def embedding(self) -> torch.Tensor:
        return self.table

    @torch.no_grad()
    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        """Keep the prefix rows; interpolate the patch rows as a 2-D image."""
        prefix, patches = self.table[: self.num_prefix], self.table[self.num_prefix :]
        image = patches.T.reshape(-1, *self.grid)  # (D, H, W)
        if mode == KEEP:
            image = image[:, edge_index(grid[0], self.grid[0])][:, :, edge_index(grid[1], self.grid[1])]
        else:
            image = _interp_2d(image, grid, mode)
        patches = image.flatten(1).T
        self.table = nn.Parameter(torch.cat([prefix, patches]))
        self.grid = tuple(grid)


class Learned2d(Encoding):
    """The paper's 2-D encoding: an X table and a Y table of width D/2, concatenated per patch."""

    injections = INJECTIONS
    on_resize = "X and Y tables interpolated along their axis ({mode}; linear unless nearest)"
    on_keep = "X and Y rows kept where the trained grid reaches (top-left aligned), rows beyond it copying the last one"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f"pos_encoding='learned_2d' needs an even width, got width={dim}")
        self.grid, self.num_prefix = tuple(grid), num_prefix
        self.x_table = nn.Parameter(torch.randn(grid[1], dim // 2) * 0.02)  # (W, D/2)
        self.y_table = nn.Parameter(torch.randn(grid[0], dim // 2) * 0.02)  # (H, D/2)

    def embedding(self) -> torch.Tensor:
        h, w = self.grid
        x = self.x_table[None, :, :].expand(h, w, -1)  # column c -> X[c]
        y = self.y_table[:, None, :].expand(h, w, -1)  # row r -> Y[r]
        patches = torch.cat([x, y], dim=-1).reshape(h * w, -1)  # (N, D)
        return F.pad(patches, (0, 0, self.num_prefix, 0))  # prefix tokens get no position

    @torch.no_grad()
    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        if mode == KEEP:
            self.x_table = nn.Parameter(self.x_table[edge_index(grid[1], self.grid[1])])
            self.y_table = nn.Parameter(self.y_table[edge_index(grid[0], self.grid[0])])
        else:
            self.x_table = nn.Parameter(_interp_1d(self.x_table, grid[1], mode))
            self.y_table = nn.Parameter(_interp_1d(self.y_table, grid[0], mode))
        self.grid = tuple(grid)


def sincos_2d_table(grid: tuple[int, int], dim: int, temperature: float = 10_000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine table (N, D): a quarter of the channels each for sin/cos of x and y."""
    quarter = dim // 4
    omega = temperature ** (-torch.arange(quarter, dtype=torch.float64) / quarter)
    y, x = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    x = x.flatten()[:, None] * omega[None]  # (N, D/4)
    y = y.flatten()[:, None] * omega[None]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).float()


class SinCos2d(Encoding):
    """Fixed 2-D sin-cos encoding, as in "Better plain ViT baselines" (no parameters)."""

    injections = ("stem", "every_layer_shared")  # a fixed table has nothing to learn per layer
    on_resize = "table recomputed for the new grid"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int):
        super().__init__()
        if dim % 4:
            raise ValueError(f"pos_encoding='sincos_2d' needs a width divisible by 4, got width={dim}")
        self.dim, self.num_prefix = dim, num_prefix
        self.resample(grid)

    def embedding(self) -> torch.Tensor:
        return self.table

    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        self.grid = tuple(grid)
        table = F.pad(sincos_2d_table(self.grid, self.dim), (0, 0, self.num_prefix, 0))
        self.register_buffer("table", table, persistent=False)  # recomputed, never saved


RELATIVE_SCALES = ("sqrt_d", "none")  # relative_1d's q.r logits: divided by sqrt(head_dim), or not
# Options an encoding may read (Encoding.reads), with their defaults (the ViT declares them, vit.VIT_OPTIONS):
# another encoding refuses them.
# relative_scale: chosen by a measurement (results/pos_encoding/relative_scale, README)
# rope_theta (None: the kind's default, rope.DEFAULT_THETA) and rope_coords: RoPE's (rope.py)
# peg_padding: PEG's border (PEG_PADDINGS); zeros is CPVT's, circular the control without absolute position
ENCODING_OPTIONS = {"relative_scale": "none", "rope_theta": None, "rope_coords": "patch", "peg_padding": "zeros"}
# What each option was before it existed: a checkpoint without it trained with this (see `trained_options`)
BEFORE_OPTIONS = {"relative_scale": "sqrt_d"}


def _offset_index(offsets: torch.Tensor, num_offsets: int, num_prefix: int) -> torch.Tensor:
    """Extend an (N, N) patch-offset index to (T, T): prefix pairs get three extra entries of their own
    (prefix query -> patch, patch query -> prefix, prefix -> prefix), as BEiT does for its [class] token."""
    if not num_prefix:
        return offsets
    t = offsets.shape[0] + num_prefix
    index = torch.full((t, t), num_offsets + 2, dtype=offsets.dtype)
    index[:num_prefix, num_prefix:] = num_offsets
    index[num_prefix:, :num_prefix] = num_offsets + 1
    index[num_prefix:, num_prefix:] = offsets
    return index


class Relative1d(Encoding):
    """The paper's relative encoding: an embedding per 1-D offset between query and key patches.

    The offset embeddings act as keys for the content query; their logits are added to the content
    logits before the softmax. Heads share the embeddings. The paper leaves the scale of these logits
    open: `relative_scale` sqrt_d divides them by sqrt(head_dim) like the content logits (Shaw et al.),
    none adds q.r unscaled.
    """

    relative, injections, reads = True, ("stem",), ("relative_scale",)  # acts inside every attention layer already
    on_resize = "each new 1-D offset takes the old embedding of the 2-D offset it stands for"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int,
                 relative_scale: str = ENCODING_OPTIONS["relative_scale"]):
        super().__init__()
        check_choice("relative_scale", relative_scale, RELATIVE_SCALES)
        self.num_prefix, self.relative_scale = num_prefix, relative_scale
        self.table = nn.Parameter(torch.randn(2 * grid[0] * grid[1] - 1, dim // heads) * 0.02)  # (2N-1, hd)
        self.prefix_table = nn.Parameter(torch.randn(3, dim // heads) * 0.02) if num_prefix else None
        self._set_grid(grid)

    def _set_grid(self, grid: tuple[int, int]) -> None:
        self.grid = tuple(grid)
        n = grid[0] * grid[1]
        pos = torch.arange(n)
        offsets = pos[:, None] - pos[None, :] + n - 1  # (N, N): row i, column j -> offset i - j
        self.register_buffer("index", _offset_index(offsets, 2 * n - 1, self.num_prefix), persistent=False)

    def offset_logits(self, q: torch.Tensor) -> torch.Tensor:
        """(..., hd) queries -> (..., 2N-1 [+3]) logits against every offset embedding (offset i-j at i-j+N-1)."""
        keys = self.table if self.prefix_table is None else torch.cat([self.table, self.prefix_table])
        scale = q.shape[-1] ** -0.5 if self.relative_scale == "sqrt_d" else 1.0
        return (q * scale) @ keys.to(q.dtype).T

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """(B, h, T, hd) queries -> (B, h, T, T) additive logits."""
        logits = self.offset_logits(q)  # (B, h, T, offsets): every query vs every offset
        return logits.gather(-1, self.index.expand(*logits.shape[:2], -1, -1))  # [i, j] = q_i . r_{i-j}

    @torch.no_grad()
    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        """Give each new 1-D offset the old embedding of the 2-D offset it stands for (see `relative_1d_rows`)."""
        self.table = nn.Parameter(self.table[relative_1d_rows(self.grid, tuple(grid))])
        self._set_grid(grid)


def relative_1d_rows(old: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """For each row of a new (H', W') 1-D offset table, the row of the old (H, W) table it copies: (2H'W' - 1,).

    A raster offset d = dy * W' + dx (|dx| < W', |dy| < H') stands for up to two 2-D offsets, (q, r) and
    (q + 1, r - W') with q, r = divmod(d, W'); the paper's encoding shares one embedding between them. We
    read d as the one the old grid has (else the shorter step: |dx|, then |dy|), clamp it to the old grid's
    offsets and copy the old embedding of that 2-D offset, row dy * W + dx. So one column right stays one
    column right and one row down stays one row down; a resize that keeps the width keeps every old row.
    """
    (h, w), (h2, w2) = old, new
    rows = []
    for d in range(-(h2 * w2 - 1), h2 * w2):
        q, r = divmod(d, w2)
        readings = [(dy, dx) for dy, dx in ((q, r), (q + 1, r - w2)) if abs(dy) < h2 and abs(dx) < w2]
        dy, dx = min(readings, key=lambda o: (abs(o[0]) >= h or abs(o[1]) >= w, abs(o[1]), abs(o[0])))
        dy, dx = max(-(h - 1), min(h - 1, dy)), max(-(w - 1), min(w - 1, dx))
        rows.append(dy * w + dx + h * w - 1)  # the old table's row of offset (dy, dx)
    return torch.tensor(rows)


class RelativeBias2d(Encoding):
    """Swin's relative position bias: a learned scalar per head for each 2-D offset."""

    relative, injections = True, ("stem",)
    on_resize = "offset table interpolated ({mode})"
    on_keep = "trained offsets kept, offsets beyond the trained range clamped to the edge offsets' biases"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int):
        super().__init__()
        self.num_prefix = num_prefix
        self.table = nn.Parameter(torch.randn(heads, 2 * grid[0] - 1, 2 * grid[1] - 1) * 0.02)
        self.prefix_table = nn.Parameter(torch.randn(heads, 3) * 0.02) if num_prefix else None
        self._set_grid(grid)

    def _set_grid(self, grid: tuple[int, int]) -> None:
        self.grid = tuple(grid)
        rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
        rows, cols = rows.flatten(), cols.flatten()
        dr = rows[:, None] - rows[None, :] + grid[0] - 1
        dc = cols[:, None] - cols[None, :] + grid[1] - 1
        offsets = dr * (2 * grid[1] - 1) + dc  # (N, N) into the flattened (2H-1)(2W-1) table
        num_offsets = (2 * grid[0] - 1) * (2 * grid[1] - 1)
        self.register_buffer("index", _offset_index(offsets, num_offsets, self.num_prefix), persistent=False)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """(B, h, T, hd) queries (unused) -> (1, h, T, T) additive logits."""
        table = self.table.flatten(1)
        if self.prefix_table is not None:
            table = torch.cat([table, self.prefix_table], dim=1)
        return table[:, self.index][None].to(q.dtype)  # (1, h, T, T)

    @torch.no_grad()
    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        """Interpolate the (h, 2H-1, 2W-1) offset table, or with KEEP give each new offset the bias of the trained
        offset nearest to it (the same one inside the trained range: Swin's table indexed by the offset)."""
        if mode == KEEP:
            rows = edge_index(2 * grid[0] - 1, 2 * self.grid[0] - 1, centred=True)
            cols = edge_index(2 * grid[1] - 1, 2 * self.grid[1] - 1, centred=True)
            self.table = nn.Parameter(self.table[:, rows][:, :, cols])
        else:
            self.table = nn.Parameter(_interp_2d(self.table, (2 * grid[0] - 1, 2 * grid[1] - 1), mode))
        self._set_grid(grid)


class Rope(Encoding):
    """2-D RoPE (see model/rope.py): queries and keys of the patch tokens turned by their (x, y) position.

    `ref` is the grid the coordinates were set for (the training grid): a persistent buffer, so a model
    resized or built at another size by loading these weights keeps it (`ref_grid` coordinates read it).
    `scaling` (rope.SCALINGS, set by `set_frequency_rule` for an evaluation) changes the frequencies on a grid
    larger than ref. The [class] and register tokens are never turned: none of the RoPE papers followed here
    (RoPE-ViT, EVA-02, DINOv3) gives them a place on the grid, so there is no published rule to turn them by.
    """

    rotary, injections, reads = True, ("stem",), ("rope_theta", "rope_coords")  # acts inside every block already
    on_resize = "nothing resampled: coordinates {rope_coords} (model.rope_coords says where the new grid's patches are)"
    figure_note = "RoPE turns queries and keys instead of adding a table, so there is no similarity to draw (see rope_offsets.png)"
    table: type[Encoding] = NoEncoding
    kind = "axial"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int, rope_theta: float | None = None,
                 rope_coords: str = "patch"):
        super().__init__()
        head_dim = dim // heads
        rope.check_head_dim(head_dim)
        check_choice("rope_coords", rope_coords, rope.COORDS)
        self.num_prefix, self.coords = num_prefix, rope_coords
        self.theta = rope.DEFAULT_THETA[self.kind] if rope_theta is None else float(rope_theta)
        self.ref_grid = tuple(grid)
        self.register_buffer("ref", torch.tensor(grid), persistent=True)  # (2,) int64: ref_grid, saved with the weights
        self.register_load_state_dict_post_hook(Rope.after_load)
        self.scaling = "none"
        self.init_frequencies(heads, head_dim)
        self.set_grid(grid)

    def init_frequencies(self, heads: int, head_dim: int) -> None:
        self.register_buffer("freqs", rope.axial_frequencies(head_dim, self.theta).float(), persistent=False)  # (2, hd/2)

    def set_grid(self, grid: tuple[int, int]) -> None:
        self.grid = tuple(grid)
        xy = rope.coordinates(self.grid, self.ref_grid, self.coords) * rope.coordinate_scale(self.coords)
        self.register_buffer("xy", xy.float(), persistent=False)  # (N, 2)

    @staticmethod
    def after_load(module: Rope, _keys) -> None:
        """A loaded `ref` (the source's training grid) moves ref_grid coordinates."""
        if not module.ref.is_meta:
            module.ref_grid = tuple(module.ref.tolist())
            module.set_grid(module.grid)

    def angles(self) -> torch.Tensor:
        """(1|h, N, hd/2) the angle of every patch's channel pairs."""
        freqs = rope.scaled_frequencies(self.freqs, self.grid, self.ref_grid, self.scaling)
        theta = rope.angles(self.xy, freqs)
        return theta if theta.ndim == 3 else theta[None]

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, h, T, hd) queries and keys, the patch tokens' turned by their positions (prefix tokens untouched)."""
        theta = self.angles()
        if self.scaling == "yarn" and (scale := rope.yarn_scale(self.grid, self.ref_grid)) != 1.0:
            q, k = q * scale, k * scale  # YaRN's temperature: logits times (0.1 ln s + 1)^2
        return rope.rotate(q, theta, self.num_prefix), rope.rotate(k, theta, self.num_prefix)

    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        """Nothing to resample: the coordinate convention says where the new grid's patches are."""
        self.set_grid(grid)


class RopeMixed(Rope):
    """Mixed RoPE: learned 2-D frequencies per head (one copy per block), started as NAVER does."""

    kind = "mixed"

    def init_frequencies(self, heads: int, head_dim: int) -> None:
        self.freqs = nn.Parameter(rope.mixed_frequencies(heads, head_dim, self.theta))  # (2, h, hd/2)


class Learned1dRopeAxial(Rope):
    """NAVER's RoPE-axial + APE: a learned_1d table added at the stem, axial RoPE in every block."""

    table, prefix_rows = Learned1d, True


class Learned1dRopeMixed(RopeMixed):
    """NAVER's RoPE-mixed + APE: a learned_1d table added at the stem, mixed RoPE in every block."""

    table, prefix_rows = Learned1d, True


LARGEST_BIAS = "pos_largest_bias"  # a record's compute fact: each head's largest attention bias, in logits


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al. 2022), (heads,): the geometric sequence 2^(-8i/n), i = 1..n, for n
    heads a power of two; otherwise that sequence for the largest power of two p below n, then every other slope
    of the 2p-head sequence (2^(-4i/p), i = 1, 3, ...), the rule of the paper's code."""
    p = 2 ** int(math.log2(heads))
    slopes = [2 ** (-8 * i / p) for i in range(1, p + 1)] + [2 ** (-4 * i / p) for i in range(1, 2 * (heads - p), 2)]
    return torch.tensor(slopes)


def grid_distances(grid: tuple[int, int]) -> torch.Tensor:
    """(N, N) Euclidean distance between the patches of an (H, W) grid, in patch units (raster order)."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    return ((rows[:, None] - rows[None, :]) ** 2 + (cols[:, None] - cols[None, :]) ** 2).double().sqrt().float()


class Alibi2d(Encoding):
    """2-D ALiBi: a fixed slope per head times the Euclidean patch distance, subtracted from the logits.

    The slopes are ALiBi's geometric sequence (`alibi_slopes`), as in the 2-D ALiBi that LookHere (Fuller et al.,
    NeurIPS 2024) compares against RoPE. Prefix tokens ([class], registers) have no place on the grid: no bias to
    or from them. Nothing is learned; a bigger grid just has longer distances.
    """

    relative, injections = True, ("stem",)  # acts inside every attention layer already
    on_resize = "nothing resampled: the same slopes times the new grid's patch distances (a bigger grid has longer ones)"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int):
        super().__init__()
        self.num_prefix = num_prefix
        self.register_buffer("slopes", alibi_slopes(heads), persistent=False)  # (h,)
        self.resample(grid)

    def facts(self) -> dict:
        """Each head's largest bias in logits (its slope times the grid's longest patch distance): on a small grid
        even the steepest head can barely tilt the attention."""
        return {LARGEST_BIAS: [round(float(b), 4) for b in self.slopes * self.distance.max()]}

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """(B, h, T, hd) queries (unused) -> (1, h, T, T) additive logits, -slope_h * distance(i, j)."""
        return -(self.slopes[:, None, None] * self.distance)[None].to(q.dtype)

    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        self.grid = tuple(grid)
        p = self.num_prefix
        distance = F.pad(grid_distances(self.grid), (p, 0, p, 0))  # (T, T): zero to and from prefix tokens
        self.register_buffer("distance", distance.to(self.slopes), persistent=False)


# PEG's border: zeros (CPVT's: the padding tells a patch near the border where it is), or circular (the grid wraps
# around, a torus: no border, so the convolution mixes each patch with its neighbours but sees no absolute position)
PEG_PADDINGS = ("zeros", "circular")


class Peg(Encoding):
    """CPVT's position encoding generator (Chu et al. 2021): a 3x3 depthwise convolution of the patch tokens on
    their grid, added to them; the zero padding at the border is what tells a patch where it is.

    `peg_padding` circular wraps the grid around instead: the same neighbourhood mixing without a border, so no
    token can tell where on the grid it is; it separates PEG's locality from the position its padding gives.

    Prefix tokens pass through. Injected at `stem`, its one place is CPVT's default, after block 0 (at the input of
    block 1); `every_layer` puts one after every block but the last (CPVT also tried several). The kernels keep
    PyTorch's default init, as CPVT's code. It works at any grid: nothing to resample.
    """

    conditional, injections, min_depth, reads = True, ("stem", "every_layer"), 2, ("peg_padding",)
    on_resize = "nothing resampled: the same 3x3 kernels slide over the new grid"
    figure_note = "positions come from a convolution of the patch tokens on their grid, not from a table: see peg_kernels.png"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int,
                 peg_padding: str = ENCODING_OPTIONS["peg_padding"]):
        super().__init__()
        check_choice("peg_padding", peg_padding, PEG_PADDINGS)
        self.grid, self.num_prefix = tuple(grid), num_prefix
        # (D, 1, 3, 3) kernels and (D,) biases; the padding mode is no parameter, so checkpoints are alike
        self.proj = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, padding_mode=peg_padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) tokens -> the same, each patch token plus the convolution of its 3x3 neighbourhood."""
        prefix, patches = x[:, : self.num_prefix], x[:, self.num_prefix :]
        image = patches.transpose(1, 2).unflatten(2, self.grid)  # (B, D, H, W)
        return torch.cat([prefix, patches + self.proj(image).flatten(2).transpose(1, 2)], dim=1)

    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        self.grid = tuple(grid)

    @classmethod
    def on_shuffle(cls, options: dict) -> str:
        """The convolution adds each patch's neighbours to it, and a shuffle changes them: content, not only position."""
        mixed = ("its 3x3 convolution over the token grid adds each patch's neighbours to it, and a shuffle changes "
                 "the neighbours")
        if options.get("peg_padding") == "circular":
            return f"{mixed}; with circular padding the grid has no border, so the drop is that neighbourhood alone"
        return (f"{mixed}, so the drop mixes position (the zero border) with neighbourhood content; "
                "model.peg_padding=circular keeps the neighbourhood without the border")


NO_POSITION = "none"  # the encoding without position: what the others are compared with (bench, figures)
ENCODINGS: dict[str, type[Encoding]] = {
    NO_POSITION: NoEncoding,
    "learned_1d": Learned1d,
    "learned_2d": Learned2d,
    "sincos_2d": SinCos2d,
    "relative_1d": Relative1d,
    "relative_bias_2d": RelativeBias2d,
    "rope_axial": Rope,
    "rope_mixed": RopeMixed,
    "learned_1d+rope_axial": Learned1dRopeAxial,
    "learned_1d+rope_mixed": Learned1dRopeMixed,
    "alibi_2d": Alibi2d,
    "peg": Peg,
}


def trained_options(options: dict) -> dict:
    """A checkpoint's model options, with the encoding's options it predates set as it trained (BEFORE_OPTIONS)."""
    kind = ENCODINGS.get(options.get("pos_encoding"))
    return {**{k: BEFORE_OPTIONS[k] for k in (kind.reads if kind else ()) if k in BEFORE_OPTIONS}, **options}


def where_acts(name: str, injection: str) -> str | None:
    """Where an encoding that does not act at the stem acts (a table's column), else None: relative and rotary ones in
    every block's attention, a conditional one (PEG) after block 0 (or after every block but the last)."""
    kind = ENCODINGS[name]
    if kind.relative or kind.rotary:
        return "every block"
    if kind.conditional:
        return "after block 0" if injection == "stem" else "after every block but the last"
    return None


class PositionEncoding(nn.Module):
    """The chosen encoding, injected where asked: at the stem, or at the input of every block.

    `num_prefix` tokens precede the patches; the first `positioned` of them (the [class] token, when the
    table covers it) are an absolute encoding's to place; the rest (registers) get no position. A rotary
    encoding has one copy per block in `rotations` and its `table` (if any) in `parts`; `options` holds
    ENCODING_OPTIONS values: the encoding gets those it `reads`.
    """

    def __init__(self, name: str, injection: str, dim: int, heads: int, grid, depth: int, num_prefix: int,
                 positioned: int | None = None, options: dict | None = None):
        super().__init__()
        kind = ENCODINGS[name]
        self.relative, self.conditional, self.injection = kind.relative, kind.conditional, injection
        positioned = num_prefix if positioned is None else positioned
        self.positioned, self.unpositioned = positioned, num_prefix - positioned
        copies = depth if (self.relative or injection == "every_layer") else 1
        if self.conditional and injection == "every_layer":
            copies = depth - 1  # between blocks: after every block but the last
        # relative encodings bias every prefix token alike; conditional ones pass them all through
        prefix = num_prefix if self.relative or self.conditional else positioned
        options = {k: v for k, v in (options or {}).items() if k in kind.reads}  # ENCODING_OPTIONS this one reads
        if kind.layered:  # each block's copy knows where it sits (LookHere's per-layer slopes)
            options = {**options, "depth": depth}
        if kind.rotary:  # the rotation in every block, the table (if any) at the stem
            self.parts = nn.ModuleList(kind.table(dim, heads, grid, prefix) for _ in range(copies))
            self.rotations = nn.ModuleList(kind(dim, heads, grid, num_prefix, **options) for _ in range(depth))
        else:
            self.parts = nn.ModuleList(kind(dim, heads, grid, prefix, **options, **({"layer": i} if kind.layered else {}))
                                       for i in range(copies))
            self.rotations = nn.ModuleList()

    @property
    def grid(self) -> tuple[int, int]:
        return self.parts[0].grid

    def add(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Add the absolute embedding due at the input of block `layer` to (B, T, D) tokens (or apply the
        conditional encoding due there: at block 1's input for `stem`, at every block's but the first's)."""
        if self.conditional:
            return self._condition(x, layer)
        if self.relative or (self.injection == "stem" and layer > 0):
            return x
        table = self.parts[layer if self.injection == "every_layer" else 0].embedding()  # (positioned + N, D)
        if table is None:
            return x
        if self.unpositioned:  # zero rows for the register tokens, between the [class] token and the patches
            p = self.positioned
            table = torch.cat([table[:p], table.new_zeros(self.unpositioned, table.shape[1]), table[p:]])
        return x + table.to(x.dtype)

    def _condition(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """The conditional encoding after block `layer - 1`, if one acts there."""
        if layer == 0 or (self.injection == "stem" and layer > 1):
            return x
        return self.parts[layer - 1 if self.injection == "every_layer" else 0](x)

    def facts(self) -> dict:
        """The built encoding's facts for the run record (its first part's, the others alike)."""
        return (self.rotations or self.parts)[0].facts()

    def attention_bias(self, layer: int) -> nn.Module | None:
        """The module that turns block `layer`'s queries into logits bias, for relative encodings."""
        return self.parts[layer] if self.relative else None

    def rotation(self, layer: int) -> nn.Module | None:
        """The module that turns block `layer`'s queries and keys (`rotate(q, k)`), for rotary encodings."""
        return self.rotations[layer] if len(self.rotations) else None

    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        """Each part to the new grid; `mode` interpolates learned tables (see each encoding's `on_resize`)."""
        for part in (*self.parts, *self.rotations):
            part.resample(grid, mode)


def set_frequency_rule(model: nn.Module, rule: str) -> int:
    """Give every RoPE module of `model` the frequency rule `rule` (rope.SCALINGS) for larger grids; how many got it.
    A rule other than none on a model without RoPE, or whose coordinates already interpolate, is a ValueError."""
    check_choice("rope scaling", rule, rope.SCALINGS)
    turned = [m for m in model.modules() if isinstance(m, Rope)]
    if rule != "none" and not turned:
        raise ValueError(f"rope scaling {rule!r} changes RoPE's frequencies, and this model has no RoPE")
    if rule != "none" and (coords := {m.coords for m in turned}) != {"patch"}:
        raise ValueError(f"rope scaling {rule!r} applies to rope_coords=patch (coordinates that extrapolate); this "
                         f"model's are {', '.join(sorted(coords))}, which already interpolate")
    for module in turned:
        module.scaling = rule
    return len(turned)


def shuffle_caveat(options: dict) -> str:
    """What else than position a shuffle changes for the encoding of these model options ('' when nothing)."""
    name = options.get("pos_encoding") or ""
    fields = {**ENCODING_OPTIONS, **{k: v for k, v in options.items() if k in ENCODING_OPTIONS}}
    return "; ".join(note for part in name.split("+") if part in ENCODINGS and (note := ENCODINGS[part].on_shuffle(fields)))


def resize_note(name: str, mode: str, options: dict | None = None) -> str:
    """What resampling to a new grid does to encoding `name` (a `+` joins the parts of a combined one), in words;
    `options` are the source's model options (RoPE's coordinate convention)."""
    fields = {"mode": mode, "rope_coords": (options or {}).get("rope_coords") or "patch"}
    kinds = [(part, ENCODINGS[part]) for part in name.split("+")]
    return "; ".join(f"{part}: {((mode == KEEP and kind.on_keep) or kind.on_resize).format(**fields)}"
                     for part, kind in kinds)

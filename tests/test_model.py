"""The backbone: every option builds, trains, and matches an independent computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vit_lightning import ViT
from vit_lightning.model import ENCODINGS, POOLINGS
from vit_lightning.model.layers import keeping_attention
from vit_lightning.model.position import sincos_2d_table

MICRO = dict(img_size=28, in_chans=1, num_classes=10, patch_size=4)
CELLS = [(name, inj) for name, encoding in ENCODINGS.items() for inj in encoding.injections]


def micro(**options) -> ViT:
    return ViT("micro", **{**MICRO, **options})


@pytest.mark.parametrize("stem", ["patch", "hybrid"])
@pytest.mark.parametrize("pooling", list(POOLINGS))
@pytest.mark.parametrize("encoding,injection", CELLS)
def test_every_combination_trains(encoding, injection, pooling, stem):
    torch.manual_seed(0)
    hybrid = dict(hybrid_layers=(1,), hybrid_width=32) if stem == "hybrid" else {}
    model = micro(pos_encoding=encoding, pos_injection=injection, pooling=pooling, stem=stem, **hybrid)
    torch.nn.init.normal_(model.head.weight, std=0.1)  # the zero-initialised head would block all gradients
    logits = model(torch.randn(3, 1, 28, 28))
    assert logits.shape == (3, 10)
    logits.logsumexp(-1).sum().backward()
    # With [class] pooling the last block's patch outputs are discarded, so its patch-to-patch
    # relative table (or FIRE's function) cannot matter; every other parameter must learn.
    last = f"pos.parts.{len(model.blocks) - 1}."
    dead = ({n for n, _ in model.named_parameters() if n.startswith(last) and not n.endswith("prefix_table")}
            if model.pos.relative and pooling == "cls" else set())  # the [class] row's own entries still matter
    for name, p in model.named_parameters():
        if name in dead:
            continue
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} gets no gradient"


def shuffle_patches(images: torch.Tensor, patch: int, perm: torch.Tensor) -> torch.Tensor:
    """Rearrange the non-overlapping patches of (B, C, H, W) images in raster order by `perm`."""
    b, c, h, w = images.shape
    gh, gw = h // patch, w // patch
    tiles = images.reshape(b, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c, patch, patch)
    tiles = tiles[:, perm].reshape(b, gh, gw, c, patch, patch)
    return tiles.permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


@pytest.mark.parametrize("encoding,injection", CELLS)
def test_only_none_is_blind_to_patch_order(encoding, injection):
    torch.manual_seed(0)
    model = micro(pos_encoding=encoding, pos_injection=injection, pooling="cls").double().eval()
    x = torch.randn(2, 1, 28, 28, dtype=torch.float64)
    x_shuffled = shuffle_patches(x, 4, torch.randperm(49))
    same = torch.allclose(model.forward_features(x), model.forward_features(x_shuffled), rtol=0, atol=1e-12)
    assert same == (encoding == "none")


def test_learned_2d_concatenates_column_and_row_halves():
    model = micro(pos_encoding="learned_2d", pooling="cls")
    enc = model.pos.parts[0]
    table = enc.embedding()  # (1 + 49, D)
    assert torch.equal(table[0], torch.zeros(64))  # the class token gets no position
    for r in range(7):
        for c in range(7):
            assert torch.equal(table[1 + r * 7 + c], torch.cat([enc.x_table[c], enc.y_table[r]]))


@pytest.mark.parametrize("encoding", ["learned_1d", "learned_2d", "sincos_2d"])
def test_every_layer_shared_adds_the_one_table_before_every_block(encoding):
    torch.manual_seed(0)
    shared = micro(pos_encoding=encoding, pos_injection="every_layer_shared").eval()
    stem = micro(pos_encoding=encoding, pos_injection="stem").eval()
    stem.load_state_dict(shared.state_dict())  # the same weights and the same single table
    table = shared.pos.parts[0].embedding()  # (1 + N, D)
    x = torch.randn(2, 1, 28, 28)
    by_hand = {}
    for name, model in (("shared", shared), ("stem", stem)):
        z = model.pool.prepend(model.stem(x))  # (B, 1 + N, D)
        for i, block in enumerate(model.blocks):
            z = block(z + table if name == "shared" or i == 0 else z)
        by_hand[name] = model.pool(z)
    assert torch.allclose(shared.forward_features(x), by_hand["shared"], atol=1e-5)
    assert torch.allclose(stem.forward_features(x), by_hand["stem"], atol=1e-5)
    assert not torch.allclose(by_hand["shared"], by_hand["stem"], atol=1e-3)


def test_an_encoding_must_declare_where_it_may_be_injected():
    from vit_lightning.model.position import Encoding

    with pytest.raises(TypeError, match="Rope must declare injections"):
        class Rope(Encoding):
            pass
    with pytest.raises(TypeError, match="from stem, every_layer, every_layer_shared; got .'sideways'"):
        class Sideways(Encoding):
            injections = ("sideways",)


def naive_attention(x, attn, bias_of) -> torch.Tensor:
    """Attention written out pair by pair; `bias_of(b, h, i, j, q_i)` is the additive logit."""
    b, t, d = x.shape
    heads = attn.heads
    hd = d // heads
    qkv = attn.qkv(x).view(b, t, 3, heads, hd)
    out = torch.zeros(b, t, heads, hd, dtype=x.dtype)
    for bi in range(b):
        for h in range(heads):
            for i in range(t):
                q = qkv[bi, i, 0, h]
                logits = torch.stack([q @ qkv[bi, j, 1, h] / math.sqrt(hd) + bias_of(bi, h, i, j, q) for j in range(t)])
                probs = logits.softmax(0)
                out[bi, i, h] = sum(probs[j] * qkv[bi, j, 2, h] for j in range(t))
    return attn.proj(out.reshape(b, t, d))


@pytest.mark.parametrize("pooling,scale", [("cls", "sqrt_d"), ("gap", "sqrt_d"), ("cls", "none"), ("gap", "none")])
def test_relative_1d_equals_naive_attention(pooling, scale):
    torch.manual_seed(0)
    model = ViT("micro", img_size=12, in_chans=1, patch_size=4, pos_encoding="relative_1d", pooling=pooling,
                relative_scale=scale).double()
    rel, attn = model.pos.parts[0], model.blocks[0].attn
    p, n = rel.num_prefix, 9

    def bias(b, h, i, j, q):
        if i < p or j < p:  # prefix pairs: own embeddings for prefix->patch, patch->prefix, prefix->prefix
            key = rel.prefix_table[0 if j >= p else 1 if i >= p else 2]
        else:
            key = rel.table[(i - p) - (j - p) + n - 1]
        return q @ key / (math.sqrt(q.shape[0]) if scale == "sqrt_d" else 1.0)

    x = torch.randn(2, p + n, 64, dtype=torch.float64)
    torch.testing.assert_close(attn(x, rel), naive_attention(x, attn, bias))


@pytest.mark.parametrize("pooling", ["cls", "gap"])
def test_relative_bias_2d_equals_naive_attention(pooling):
    torch.manual_seed(0)
    model = ViT("micro", img_size=(8, 12), in_chans=1, patch_size=4, pos_encoding="relative_bias_2d", pooling=pooling).double()
    rel, attn = model.pos.parts[0], model.blocks[0].attn
    p, (gh, gw) = rel.num_prefix, rel.grid
    assert rel.table.shape == (4, 2 * gh - 1, 2 * gw - 1)  # (2H-1)(2W-1) entries per head

    def bias(b, h, i, j, q):
        if i < p or j < p:
            return rel.prefix_table[h, 0 if j >= p else 1 if i >= p else 2]
        (ri, ci), (rj, cj) = divmod(i - p, gw), divmod(j - p, gw)
        return rel.table[h, ri - rj + gh - 1, ci - cj + gw - 1]

    x = torch.randn(2, p + gh * gw, 64, dtype=torch.float64)
    torch.testing.assert_close(attn(x, rel), naive_attention(x, attn, bias))


def test_attention_maps_give_the_same_numbers():
    torch.manual_seed(0)
    model = micro(pos_encoding="relative_1d", pooling="cls").eval()
    torch.nn.init.normal_(model.head.weight, std=0.1)
    x = torch.randn(2, 1, 28, 28)
    fused = model(x)
    maps = model.attention_maps(x)
    assert len(maps) == 4 and maps[0].shape == (2, 4, 50, 50)
    torch.testing.assert_close(maps[2].sum(-1), torch.ones(2, 4, 50))
    with keeping_attention(model.blocks):
        explicit = model(x)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "timm_name,variant,patch",
    [("vit_base_patch16_224", "B", 16), ("vit_large_patch16_224", "L", 16), ("vit_huge_patch14_224", "H", 14)],
)
def test_parameter_count_equals_timm(timm_name, variant, patch):
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        reference = timm.create_model(timm_name, pretrained=False, num_classes=1000)
        ours = ViT(variant, img_size=224, num_classes=1000, patch_size=patch)
    assert ours.num_params() == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("encoding", ["learned_1d", "learned_2d", "sincos_2d", "relative_1d", "relative_bias_2d",
                                      "alibi_2d", "peg"])
def test_resample_to_the_same_grid_is_identity(encoding):
    model = micro(pos_encoding=encoding)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(1, 1, 28, 28)
    out = model(x)
    model.resize(28)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    torch.testing.assert_close(model(x), out)


def test_resample_learned_1d_interpolates_the_grid_and_keeps_the_class_token():
    model = micro(pos_encoding="learned_1d", pooling="cls")
    table = model.pos.parts[0].table.detach().clone()  # (1 + 49, D)
    model.resize(44)  # 11 x 11 patches
    new = model.pos.parts[0].table
    assert new.shape == (1 + 121, 64)
    assert torch.equal(new[0], table[0])
    image = table[1:].T.reshape(1, 64, 7, 7)
    expected = F.interpolate(image, size=(11, 11), mode="bicubic", align_corners=False, antialias=True)[0].flatten(1).T
    torch.testing.assert_close(new[1:], expected)
    # smooth: neighbouring cells of the new table are no further apart than the old table's steps allow
    old_step = (image[0, :, 1:] - image[0, :, :-1]).abs().max()
    new_image = new[1:].T.reshape(64, 11, 11)
    assert (new_image[:, 1:] - new_image[:, :-1]).abs().max() <= 1.5 * old_step
    assert model(torch.randn(2, 1, 44, 44)).shape == (2, 10)


def test_resample_other_encodings_to_a_larger_grid():
    m2d = micro(pos_encoding="learned_2d")
    x_old = m2d.pos.parts[0].x_table.detach().clone()
    m2d.resize((28, 40))  # 7 x 10 patches
    expected = F.interpolate(x_old.T[None], size=10, mode="linear", align_corners=False)[0].T
    torch.testing.assert_close(m2d.pos.parts[0].x_table, expected)
    assert m2d.pos.parts[0].y_table.shape == (7, 32)

    msc = micro(pos_encoding="sincos_2d", pooling="gap")
    msc.resize(40)
    torch.testing.assert_close(msc.pos.parts[0].table, sincos_2d_table((10, 10), 64))

    mrb = micro(pos_encoding="relative_bias_2d")
    old = mrb.pos.parts[1].table.detach().clone()
    mrb.resize(40)
    expected = F.interpolate(old[None], size=(19, 19), mode="bicubic", align_corners=False, antialias=True)[0]
    torch.testing.assert_close(mrb.pos.parts[1].table, expected)

    for model in (m2d, msc, mrb):
        h, w = model.config.img_hw
        assert model(torch.randn(1, 1, h, w)).shape == (1, 10)


def relative_1d_bias(model: ViT, q: torch.Tensor, query: tuple[int, int], key: tuple[int, int]) -> torch.Tensor:
    """Block 0's relative logit between the patches at (row, col) `query` and `key` for queries (1, h, T, hd)."""
    p, w = model.pool.num_prefix, model.pos.grid[1]
    i, j = p + query[0] * w + query[1], p + key[0] * w + key[1]
    return model.pos.parts[0](q)[0, :, i, j]  # (h,)


@pytest.mark.parametrize("old_img,new_img", [(16, 32), (32, 16), (16, (28, 16))])
def test_resample_relative_1d_keeps_what_an_offset_means(old_img, new_img):
    """4x4 -> 8x8 (and back, and taller): one column right, one row down, and their opposites keep their embedding."""
    torch.manual_seed(0)
    model = ViT("micro", img_size=old_img, in_chans=1, patch_size=4, pos_encoding="relative_1d", pooling="gap",
                relative_scale="sqrt_d")
    old = model.pos.parts[0]
    (h, w), table = old.grid, old.table.detach().clone()
    model.resize(new_img)
    (h2, w2), new = model.pos.grid, model.pos.parts[0].table
    assert new.shape == (2 * h2 * w2 - 1, 16)
    for dy, dx in [(0, 1), (1, 0), (0, -1), (-1, 0), (1, 1), (-1, 1)]:
        assert torch.equal(new[dy * w2 + dx + h2 * w2 - 1], table[dy * w + dx + h * w - 1]), (dy, dx)
    # the same through attention: a query's logit for the patch one column right / one row down of it
    q = torch.randn(1, 4, h2 * w2, 16)
    for step, (dy, dx) in {"right": (0, 1), "down": (1, 0)}.items():
        expected = q[0, :, 1 * w2 + 1] @ table[-(dy * w + dx) + h * w - 1] / 4  # offset i - j = -(dy, dx)
        torch.testing.assert_close(relative_1d_bias(model, q, (1, 1), (1 + dy, 1 + dx)), expected, msg=step)
    if w2 == w:  # the width kept: every offset the old grid had keeps its embedding
        inside = torch.arange(-(h * w - 1), h * w) + h2 * w2 - 1
        assert torch.equal(new[inside], table)


@pytest.mark.parametrize(
    "options,expected",
    [
        (dict(img_size=30), "not divisible by patch_size=4; valid patch sizes: [1, 2, 3, 5, 6, 10, 15, 30]"),
        (dict(heads=5), "heads=5 does not divide width=64"),
        (dict(pos_encoding="rope"), "unknown model.pos_encoding='rope'; choose from: none, learned_1d, learned_2d, sincos_2d"),
        (dict(pooling="max"), "choose from: cls, gap, gap_fcnorm, gap_fcnorm_cls, map"),
        (dict(stem="conv"), "choose from: patch, hybrid"),
        (dict(variant="XL"), "choose from: micro, Ti, S, B, L, H"),
        (dict(pos_encoding="relative_1d", pos_injection="every_layer"), "allowed: stem"),
        (dict(pos_encoding="relative_1d", relative_scale="d"), "unknown model.relative_scale='d'; choose from: sqrt_d, none"),
        (dict(pos_encoding="learned_1d", relative_scale="sqrt_d"),
         "model.relative_scale='sqrt_d' applies to pos_encoding=relative_1d only, not pos_encoding=learned_1d"),
        (dict(pos_encoding="sincos_2d", pos_injection="every_layer"), "allowed: stem, every_layer_shared"),
        (dict(stem="hybrid", hybrid_width=48), "hybrid_width a multiple of 32"),
    ],
)
def test_bad_options_raise_one_line(options, expected):
    with pytest.raises(ValueError) as error:
        ViT(**{**dict(variant="micro"), **MICRO, **options})
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_wrong_input_size_says_to_resize():
    with pytest.raises(ValueError, match=r"call model.resize"):
        micro()(torch.randn(1, 1, 32, 32))


def test_config_is_plain_values():
    cfg = micro(stem="hybrid", hybrid_layers=(1, 2)).config.to_dict()
    assert cfg["hybrid_layers"] == [1, 2] and cfg["depth"] == 4 and cfg["width"] == 64
    assert all(v is None or isinstance(v, (int, float, str, list)) for v in cfg.values())


@pytest.mark.parametrize("options,expected", [
    ({"pos_encoding": "relative_1d"}, "sqrt_d"),  # written before the option: it trained with 1/sqrt(head_dim)
    ({"pos_encoding": "relative_1d", "relative_scale": "none"}, "none"),
    ({"pos_encoding": "learned_1d"}, None),  # an encoding that does not read it gets nothing
])
def test_a_checkpoint_is_read_with_the_relative_scale_it_trained_with(tmp_path, options, expected):
    from vit_lightning.run.rundir import read_checkpoint

    torch.save({"state_dict": {}, "hyper_parameters": options}, tmp_path / "last.ckpt")
    assert read_checkpoint(tmp_path / "last.ckpt")["hyper_parameters"].get("relative_scale") == expected

"""Layer scale, register tokens, qk-norm and pos_embed_class: each matches a hand computation, trains, and is
refused in one line where it cannot apply."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from tiny import TINY_MODEL

from vit_lightning import ViT
from vit_lightning.commands.fit import main as train
from vit_lightning.commands.viz import analysis
from vit_lightning.model import Swin
from vit_lightning.model.layers import Attention, Block

MICRO = dict(img_size=28, in_chans=1, num_classes=10, patch_size=7)  # a 4 x 4 grid


def _randomise(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(3)
    for p in model.parameters():
        p.data.normal_(0, 0.2)
    return model.eval()


def test_layer_scale_scales_each_branch_and_starts_at_its_value():
    for init in ("paper", "timm"):
        block = Block(16, 2, 32, scale=0.3)
        block.init_weights(init)
        assert torch.equal(block.ls1.gamma, torch.full((16,), 0.3)) and torch.equal(block.ls2.gamma, block.ls1.gamma)
    block = _randomise(Block(16, 2, 32, scale=0.3))
    x = torch.randn(2, 5, 16)
    h = x + block.ls1.gamma * block.attn(block.norm1(x))
    want = h + block.ls2.gamma * block.mlp(block.norm2(h))
    torch.testing.assert_close(block(x), want)
    assert isinstance(Block(16, 2, 32).ls1, torch.nn.Identity)  # off by default: no parameter at all


def test_qk_norm_normalises_each_heads_queries_and_keys():
    attn = _randomise(Attention(16, 2, qk_norm=True))
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)  # (B, h, T, 8)
    q = F.layer_norm(q, (8,), attn.q_norm.weight, attn.q_norm.bias, eps=1e-6)
    k = F.layer_norm(k, (8,), attn.k_norm.weight, attn.k_norm.bias, eps=1e-6)
    probs = (q @ k.transpose(-2, -1) / 8**0.5).softmax(-1)
    want = attn.proj((probs @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attn(x), want)


def _by_hand(model: ViT, x: torch.Tensor) -> torch.Tensor:
    """The forward pass written out: [class], registers (no position), patches + table, blocks, pooling."""
    patches = model.stem(x)  # (B, N, D)
    table = model.pos.parts[0].table  # ([class] row if pos_embed_class) + N rows
    has_cls, rows = model.pool.num_prefix == 1, len(table) - patches.shape[1]
    patches = patches + table[rows:]
    prefix = [model.registers.tokens.expand(len(x), -1, -1)]
    if has_cls:
        token = model.pool.token.expand(len(x), -1, -1)
        prefix.insert(0, token + table[0] if rows else token)  # pos_embed_class=false: no row for it
    z = torch.cat([*prefix, patches], 1)
    for block in model.blocks:
        z = block(z)
    patch_out = z[:, 1 + model.registers.count:] if has_cls else z[:, model.registers.count:]
    pooled = model.pool.norm(z[:, 0]) if model.config.pooling == "cls" else model.pool.norm(patch_out).mean(1)
    return model.head(pooled)


@pytest.mark.parametrize("pooling,embed_class", [("cls", True), ("cls", False), ("gap", True)])
def test_registers_have_no_position_and_stay_out_of_the_pooling(pooling, embed_class):
    model = _randomise(ViT("micro", **MICRO, reg_tokens=3, pooling=pooling, pos_embed_class=embed_class))
    cls = 1 if pooling == "cls" else 0
    assert model.num_prefix == cls + 3 and model.pos.parts[0].table.shape == (16 + (cls and embed_class), 64)
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(model(x), _by_hand(model, x))
    assert "registers.tokens" in model.no_weight_decay()
    maps = model.attention_maps(x)
    assert maps[0].shape == (2, 4, cls + 3 + 16, cls + 3 + 16)


def test_registers_are_left_out_of_the_figures():
    model = _randomise(ViT("micro", **MICRO, reg_tokens=2, pooling="gap"))
    [table] = analysis.position_tables(model)
    torch.testing.assert_close(table, model.pos.parts[0].table.detach())  # 16 patch rows, nothing for registers
    rollout = torch.rand(1, 18, 18)
    by_hand = rollout[:, 2:, 2:].mean(1).reshape(1, 4, 4)  # GAP: the patch rows, over the patch columns
    torch.testing.assert_close(analysis.rollout_on_grid(rollout, (4, 4), 2, class_token=False), by_hand)
    rollout = torch.rand(1, 19, 19)  # [class], two registers, 16 patches: the [class] row
    torch.testing.assert_close(analysis.rollout_on_grid(rollout, (4, 4), 3), rollout[:, 0, 3:].reshape(1, 4, 4))
    uniform = [torch.full((1, 4, 18, 18), 1 / 18)]  # registers take attention, but distances are between patches
    plain = [torch.full((1, 4, 16, 16), 1 / 16)]
    torch.testing.assert_close(analysis.attention_distance_sum(uniform, (4, 4), 7.0, 2),
                               analysis.attention_distance_sum(plain, (4, 4), 7.0, 0))


@pytest.mark.parametrize("encoding,injection", [
    ("learned_1d", "every_layer"), ("learned_2d", "stem"), ("learned_2d", "every_layer_shared"),
    ("sincos_2d", "every_layer_shared"), ("relative_1d", "stem"), ("relative_bias_2d", "stem"), ("none", "stem"),
    ("alibi_2d", "stem"), ("peg", "every_layer")])
def test_registers_work_with_every_position_encoding(encoding, injection):
    model = ViT("micro", **MICRO, reg_tokens=2, pos_encoding=encoding, pos_injection=injection, layer_scale=0.1,
                qk_norm=True)
    torch.nn.init.normal_(model.head.weight, std=0.1)
    model(torch.randn(2, 1, 28, 28)).logsumexp(-1).sum().backward()
    assert model.registers.tokens.grad.abs().sum() > 0  # the registers take part and learn


def test_swin_takes_layer_scale_and_qk_norm():
    swin = Swin("micro", img_size=28, patch_size=2, in_chans=1, num_classes=5, layer_scale=0.1, qk_norm=True)
    assert all(torch.equal(b.ls2.gamma, torch.full_like(b.ls2.gamma, 0.1)) for b in swin.blocks)
    assert all(isinstance(b.attn.k_norm, torch.nn.LayerNorm) for b in swin.blocks)
    assert swin(torch.randn(2, 1, 28, 28)).shape == (2, 5)


@pytest.mark.parametrize("build,options,mentions", [
    (ViT, dict(layer_scale=0.0), "layer_scale must be a positive"),
    (ViT, dict(reg_tokens=-1), "reg_tokens must be a count"),
    (ViT, dict(pooling="gap", pos_embed_class=False), "pooling='gap' has no [class] token"),
    (ViT, dict(pos_encoding="sincos_2d", pos_embed_class=False), "only learned_1d has a [class] row"),
    (Swin, dict(reg_tokens=4), "model.reg_tokens=4 applies to arch=vit only"),
    (Swin, dict(pos_embed_class=False), "model.pos_embed_class=False applies to arch=vit only"),
])
def test_bad_combinations_are_refused_in_one_line(build, options, mentions):
    with pytest.raises(ValueError) as error:
        build("micro", **options)
    assert mentions in str(error.value) and "\n" not in str(error.value)


# ---- each option fits the demo (one tiny step), and with two DDP processes ---------------------------------------
TINY = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
        "--run.fewshot_shots=[2]"]
OPTIONS = {
    "layer-scale": ["--model.layer_scale=0.1"],
    "registers": ["--model.reg_tokens=2"],
    "registers-gap": ["--model.reg_tokens=1", "--model.pooling=gap"],
    "qk-norm": ["--model.qk_norm=true"],
    "no-embed-class": ["--model.pos_embed_class=false"],
    "swin-layer-scale-qk-norm": ["--model.arch=swin", "--model.patch_size=2", "--model.width=32", "--model.heads=null",
                                 "--model.depth=null", "--model.mlp_dim=null", "--model.layer_scale=0.1",
                                 "--model.qk_norm=true"],
}


def _record(root):
    [path] = sorted(root.glob("*/*/*/results.json"))
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("extra", OPTIONS.values(), ids=OPTIONS.keys())
def test_each_option_fits_the_demo(extra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, *extra]) == 0
    record = _record(tmp_path / "runs")
    assert record["status"] == "completed", record["error"]
    for arg in extra:
        key, value = arg[2:].split("=", 1)
        assert str(record["config"][key]).lower() == value.replace("null", "none"), key


@pytest.mark.slow
@pytest.mark.ddp
def test_the_options_together_fit_with_two_ddp_processes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    options = ["--model.layer_scale=0.1", "--model.reg_tokens=2", "--model.qk_norm=true", "--model.pos_embed_class=false"]
    assert train.main([*TINY, *options, "--trainer.devices=2", "--trainer.strategy=ddp"]) == 0
    record = _record(tmp_path / "runs")
    assert record["status"] == "completed" and record["compute"]["num_devices"] == 2
    assert record["config"]["model.reg_tokens"] == 2


@pytest.mark.slow
def test_a_bad_combination_fails_fit_in_one_line_before_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, "--model.pooling=gap", "--model.pos_embed_class=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pos_embed_class=false" in err[0] and list(tmp_path.iterdir()) == []

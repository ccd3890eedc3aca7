"""Swin: timm's SwinTransformer as the oracle (parameter counts, logits after a weight copy), the shift, the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from vit_lightning import Swin, load_timm_weights
from vit_lightning.commands.fit import main as train
from vit_lightning.model.swin import shift_mask, window_merge, window_partition

timm = pytest.importorskip("timm")
from timm.models.swin_transformer import SwinTransformer  # noqa: E402


@pytest.mark.parametrize("variant,name,millions", [
    ("T", "swin_tiny_patch4_window7_224", 28.29), ("S", "swin_small_patch4_window7_224", 49.61),
    ("B", "swin_base_patch4_window7_224", 87.77),
])
def test_parameter_counts_equal_timm(variant, name, millions):
    with torch.device("meta"):  # sizes only: no memory, no init
        reference = timm.create_model(name, pretrained=False)
        ours = Swin(variant)
    count = sum(p.numel() for p in reference.parameters())
    assert ours.num_params() == count and round(count / 1e6, 2) == millions


def _randomise(module):
    torch.manual_seed(1)
    for p in module.parameters():
        p.data.normal_(0, 0.1)
    return module.eval()


# micro: width 32, depths (2, 2), heads (2, 4); sizes chosen to pad (10x10 and 5x5 maps, window 4), shrink the
# window to the map (4x4 then 2x2 with window 7: no shift), and the demo's 14x14 then 7x7 with window 7
CASES = {"pad-and-shift": (40, 4, 4), "window-shrinks": (16, 4, 7), "demo": (28, 2, 7)}


@pytest.mark.parametrize("img,patch,window", CASES.values(), ids=CASES.keys())
def test_logits_equal_timm_after_weight_copy(img, patch, window):
    reference = _randomise(SwinTransformer(img_size=img, patch_size=patch, in_chans=1, num_classes=5, embed_dim=32,
                                           depths=(2, 2), num_heads=(2, 4), window_size=window))
    ours = Swin("micro", img_size=img, patch_size=patch, in_chans=1, num_classes=5, window_size=window).eval()
    load_timm_weights(ours, reference)
    x = torch.randn(3, 1, img, img)
    assert (ours(x) - reference(x)).abs().max() < 1e-5


def test_swin_tiny_logits_equal_timm():
    reference = _randomise(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=10))
    ours = Swin("T", num_classes=10).eval()
    load_timm_weights(ours, reference)
    x = torch.randn(1, 3, 224, 224)
    assert (ours(x) - reference(x)).abs().max() < 1e-4


@pytest.mark.parametrize("ours,mentions", [
    (dict(shift=False), "shift"), (dict(pos_encoding="learned_1d+relative_bias_2d"), "pos_encoding"),
    (dict(window_size=4), "window"),
])
def test_timm_models_that_differ_are_refused_in_one_line(ours, mentions):
    reference = SwinTransformer(img_size=28, patch_size=2, in_chans=1, num_classes=5, embed_dim=32, depths=(2, 2),
                                num_heads=(2, 4), window_size=7)
    model = Swin("micro", **{"img_size": 28, "patch_size": 2, "in_chans": 1, "num_classes": 5, **ours})
    with pytest.raises(ValueError, match=mentions) as error:
        load_timm_weights(model, reference)
    assert "\n" not in str(error.value)


def test_window_partition_round_trips_and_mask_matches_regions():
    x = torch.randn(2, 8, 12, 3)
    assert torch.equal(window_merge(window_partition(x, 4), 4, 8, 12), x)
    mask = shift_mask(8, 8, 4, 2)  # 4 windows; the last row/column of windows mixes regions
    assert mask.shape == (4, 16, 16) and not mask[0].isinf().any()  # top-left window: one region
    # bottom-right window: rows 4-5 vs 6-7 and columns 4-5 vs 6-7 of the rolled map are four regions
    rows, cols = torch.arange(16) // 4, torch.arange(16) % 4
    region = (rows >= 2).long() * 2 + (cols >= 2).long()
    assert torch.equal(mask[3].isinf(), region[:, None] != region[None, :])


def _reach(shift: bool, blocks: int) -> torch.Tensor:
    """Which input tokens of the 14x14 map change the output at token (6, 6) after `blocks` blocks: (14, 14) bools."""
    torch.manual_seed(0)
    model = Swin("micro", img_size=28, patch_size=2, in_chans=1, num_classes=5, shift=shift).double()
    x = torch.randn(1, 14, 14, 32, dtype=torch.float64, requires_grad=True)
    y = x
    for block in model.stages[0].blocks[:blocks]:
        y = block(y)
    y[0, 6, 6].sum().backward()  # (6, 6): in the first window, and not wrapped by the shift
    return x.grad[0].abs().sum(-1) > 0


def test_without_shift_a_token_never_sees_outside_its_window():
    reach = _reach(shift=False, blocks=2)
    assert reach[:7, :7].all() and not reach[7:].any() and not reach[:, 7:].any()


def test_with_shift_information_crosses_windows_after_two_blocks():
    assert not _reach(shift=True, blocks=1)[7:].any()  # the first block is not shifted
    reach = _reach(shift=True, blocks=2)
    assert reach[7:].any() and reach[:, 7:].any()


def test_resize_resamples_bias_tables_and_keeps_running():
    model = Swin("micro", img_size=28, patch_size=2, in_chans=1, num_classes=5, pos_encoding="learned_1d+relative_bias_2d")
    model.resize(56, window_size=14)
    assert model.stages[0].blocks[0].bias.relative.table.shape == (2, 27, 27) and model.pos.table.shape == (784, 32)
    assert model(torch.randn(2, 1, 56, 56)).shape == (2, 5)
    maps = model.attention_maps(torch.randn(1, 1, 56, 56))
    assert maps[0].shape == (4, 2, 196, 196) and torch.allclose(maps[0].sum(-1), torch.tensor(1.0))


@pytest.mark.parametrize("options,mentions", [
    (dict(depth=3), "model.depth=3 applies to arch=vit only"), (dict(pooling="cls"), "pooling"),
    (dict(pos_encoding="relative_1d"), "pos_encoding"), (dict(variant="Ti"), "variant"),
    (dict(pos_injection="every_layer"), "pos_injection"), (dict(drop_path=1.0), "drop_path"),
    (dict(hybrid_width=32), "model.hybrid_width=32 applies to arch=vit only"),
    (dict(init="xavier"), "unknown model.init='xavier'; choose from: paper, timm"),
    (dict(relative_scale="sqrt_d"), "model.relative_scale='sqrt_d' applies to arch=vit only"),
])
def test_options_of_the_other_arch_are_refused(options, mentions):
    with pytest.raises(ValueError, match=mentions):
        Swin(**{"variant": "micro", **options})


def test_vit_refuses_swin_options():
    from vit_lightning import ViT

    with pytest.raises(ValueError, match="window_size=4 applies to arch=swin only"):
        ViT(window_size=4)


TINY = ["--model.arch=swin", "--model.patch_size=2", "--data.batch_size=16", "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu", "--run.fewshot_shots=[]"]


def _record(root):
    [path] = sorted(root.glob("*/*/*/results.json"))
    return json.loads(path.read_text())


@pytest.mark.parametrize("extra", [["--model.pos_encoding=learned_1d+relative_bias_2d", "--model.drop_path=0.1"],
                                   ["--model.shift=false", "--model.pos_encoding=none"]], ids=["abs-rel", "no-shift"])
@pytest.mark.slow
def test_fit_trains_a_swin(extra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, *extra]) == 0
    record = _record(tmp_path / "runs")
    assert record["status"] == "completed", record["error"]
    assert record["config"]["model.arch"] == "swin" and record["compute"]["gflops_per_image"] > 0
    micro = Swin("micro", img_size=28, patch_size=2, in_chans=1, num_classes=10,
                 pos_encoding=record["config"]["model.pos_encoding"])
    assert record["compute"]["params"] == micro.num_params()


def test_fit_refuses_a_vit_option_for_swin_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, "--model.pos_injection=every_layer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pos_injection" in err[0] and list(tmp_path.iterdir()) == []


@pytest.mark.ddp
@pytest.mark.slow
def test_fit_swin_ddp_two_cpu_processes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert train.main([*TINY, "--trainer.devices=2", "--trainer.strategy=ddp"]) == 0
    record = _record(tmp_path / "runs")
    assert record["status"] == "completed" and record["compute"]["num_devices"] == 2


@pytest.mark.slow
def test_arch_defaults_are_recorded_and_name_the_run_as_before_swin(tmp_path, monkeypatch):
    """A plain ViT fit records cls / learned_1d / patch 7 (not null) and its name no arch; Swin gets its own."""
    monkeypatch.chdir(tmp_path)
    plain = [a for a in TINY if not a.startswith(("--model.arch", "--model.patch_size"))]
    assert train.main([*plain, "--run.root=vit"]) == 0 and train.main([*plain, "--run.root=swin", "--model.arch=swin"]) == 0
    vit, swin = _record(tmp_path / "vit"), _record(tmp_path / "swin")
    got = {k: vit["config"][f"model.{k}"] for k in ("pooling", "pos_encoding", "patch_size")}
    assert got == {"pooling": "cls", "pos_encoding": "learned_1d", "patch_size": 7}
    assert "-learned_1d-stem-cls-" in vit["config"]["run.trial"] and "-vit-" not in vit["config"]["run.trial"]
    got = {k: swin["config"][f"model.{k}"] for k in ("pooling", "pos_encoding", "patch_size")}
    assert got == {"pooling": "gap", "pos_encoding": "relative_bias_2d", "patch_size": 2}  # 14x14 tokens, window 7
    assert "-p2-relative_bias_2d-" in swin["config"]["run.trial"]


@pytest.mark.parametrize("head", ["linear", "mlp_tanh"])
def test_init_is_the_swin_papers(head):
    """trunc_normal(0.02) dense kernels and zero biases, PyTorch's conv init for the stem, a zero classifier."""
    import math

    from torch import nn

    torch.manual_seed(0)
    model = Swin("micro", img_size=28, patch_size=2, in_chans=1, num_classes=10, head=head)
    *dense, classifier = [m for m in model.modules() if isinstance(m, nn.Linear)]
    kernels = torch.cat([m.weight.flatten() for m in dense])
    # torch's trunc_normal_ cuts at +-2 absolute, so at std 0.02 it is a plain normal (as in timm's and the reference)
    assert abs(kernels.std().item() - 0.02) < 5e-4 and abs(kernels.mean().item()) < 5e-4
    assert all(m.bias is None or not m.bias.any() for m in dense)
    assert not classifier.weight.any() and not classifier.bias.any()
    conv = model.stem.proj.weight  # kaiming_uniform(a=sqrt(5)): uniform within 1 / sqrt(fan_in)
    bound = 1 / math.sqrt(conv[0].numel())
    assert conv.abs().max() <= bound and abs(conv.std().item() - bound / math.sqrt(3)) < 0.2 * bound


def test_paper_init_on_a_swin_is_fan_in_scaled():
    """model.init=paper: xavier_uniform attention and MLP kernels, lecun_normal stem and patch merging, zero classifier."""
    import math

    torch.manual_seed(0)
    model = Swin("micro", img_size=28, patch_size=2, in_chans=1, num_classes=10, init="paper")
    assert model.config.init == "paper" and Swin("micro").config.init == "timm"  # Swin's default: its paper's
    for block in model.blocks:
        for kernel in (*block.attn.qkv.weight.chunk(3), block.attn.proj.weight, block.mlp.fc1.weight):
            fan_out, fan_in = kernel.shape
            bound = math.sqrt(6 / (fan_in + fan_out))  # xavier_uniform
            assert kernel.abs().max() <= bound and abs(kernel.std().item() - bound / math.sqrt(3)) < 0.1 * bound
    for kernel in (model.stem.proj.weight, model.stages[1].merge.reduction.weight):  # lecun_normal: std 1/sqrt(fan_in)
        std = 1 / math.sqrt(kernel[0].numel())
        assert abs(kernel.std().item() - std) < 0.15 * std and kernel.abs().max() <= 2.3 * std
    assert not model.head.weight.any() and not model.head.bias.any()


def test_swin_ablation_runs_table4_with_the_papers_numbers_and_recipe():
    from vit_lightning.ablation import load
    from vit_lightning.model.swin import stage_grids

    ablation = load("swin")
    table4 = {("relative_bias_2d", False): 80.2, ("relative_bias_2d", True): 81.3, ("none", True): 80.1,
              ("learned_1d", True): 80.5, ("learned_1d+relative_bias_2d", True): 81.3}  # Swin-T top-1, %
    for prof in ablation.profiles.values():
        cells = {(c["model.pos_encoding"], c["model.shift"]) for c in prof.cells()}
        assert cells == set(table4) and prof.fixed["model.arch"] == "swin"
    assert {k: round(100 * v, 1) for k, v in ablation.reference.items()} == table4
    demo = ablation.profiles["demo"].fixed
    model = Swin(demo["model.variant"], img_size=28, in_chans=1, num_classes=10, patch_size=demo["model.patch_size"],
                 window_size=demo["model.window_size"], init=demo["model.init"])
    assert stage_grids(model.stem.grid_for((28, 28)), len(model.stages)) == [(14, 14), (7, 7)]
    assert [b.s for b in model.blocks] == [0, 2, 0, 2]  # both stages shift by 4 // 2: the demo's shift has work to do
    assert [b.bias.mask.shape[0] for b in model.blocks if b.s] == [16, 4]  # windows: 16x16 and 8x8 padded maps
    imagenet = ablation.profiles["imagenet"].fixed  # appendix A2.1: 300 epochs, 20 warm-up, cosine, wd 0.05, dp 0.2
    recipe = {"model.variant": "T", "trainer.max_epochs": 300, "model.warmup_epochs": 20, "model.schedule": "cosine",
              "model.optimizer": "adamw", "model.weight_decay": 0.05, "model.drop_path": 0.2, "model.lr": 0.001}
    assert {k: imagenet[k] for k in recipe} == recipe


@pytest.mark.slow
def test_fewshot_on_a_swin_run_during_fit_and_from_its_checkpoint(tmp_path, monkeypatch):
    """fit's few-shot probe reads Swin's pooled features; `vit-ablate fewshot` on the run repeats its numbers."""
    from vit_lightning.analysis import fewshot

    monkeypatch.chdir(tmp_path)
    argv = [a for a in TINY if not a.startswith("--run.fewshot_shots")]
    assert train.main([*argv, "--run.fewshot_shots=[2]"]) == 0
    [path] = sorted((tmp_path / "runs").glob("*/*/*/results.json"))
    during = json.loads(path.read_text())["metrics"]
    assert 0.0 < during["val/fewshot2"] <= 1.0
    assert fewshot.main([str(path.parent), "--shots", "2"]) == 0
    after = json.loads(path.read_text())["metrics"]
    assert after["val/fewshot2"] == pytest.approx(during["val/fewshot2"], abs=1e-6)
    # and the figures that apply to it, with a note for each that does not
    from vit_lightning.commands.viz import cli as viz

    assert viz.main([str(path.parent), "--out", str(tmp_path / "viz"), "--images", "4", "--wandb", "off"]) == 0
    made = {p.name for p in (tmp_path / "viz").iterdir()}
    assert {"pos_bias.png", "pos_bias.csv", "attention_distance.png", "patch_pca.png", "rollout.txt",
            "pos_similarity.txt"} <= made and "rollout.png" not in made
    notes = {name: (tmp_path / "viz" / f"{name}.txt").read_text().strip() for name in ("rollout", "pos_similarity")}
    assert notes == {  # the family's notes (Family.figure_notes), as the figures wrote them before
        "rollout": "arch=swin: attention stays inside each window and tokens merge between stages, so there is no "
                   "token-to-token rollout through the network",
        "pos_similarity": "no absolute position table (Swin's default is the relative bias alone), so there is no "
                          "similarity to draw"}
    rows = (tmp_path / "viz" / "pos_bias.csv").read_text().splitlines()
    assert len(rows) - 1 == 2 * (2 * 13**2) + 2 * (4 * 13**2)  # stage 1: 2 heads, stage 2: 4 heads; offsets of m=7


def test_window_distance_of_uniform_attention_is_the_mean_pairwise_distance():
    from vit_lightning.commands.viz.windowed import window_distance

    m, stride = 3, 2.0
    probs = torch.full((5, 2, m * m, m * m), 1.0 / (m * m))  # 5 windows, 2 heads
    cells = [(r, c) for r in range(m) for c in range(m)]
    pairwise = sum(stride * ((a - c) ** 2 + (b - d) ** 2) ** 0.5 for a, b in cells for c, d in cells) / len(cells) ** 2
    assert torch.allclose(window_distance(probs, m, stride) / (5 * m * m), torch.tensor(pairwise, dtype=torch.float64))

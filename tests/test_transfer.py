"""Transfer: position tables resampled like a hand computation, a timm ViT via timm:NAME@FILE, fine-tuning at
56 px from a 28 px run, `vit-ablate eval`, and bad sources refused in one line before anything is written."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from tiny import TINY_MODEL

from vit_lightning import ViT, cli
from vit_lightning.commands.fit import main as train
from vit_lightning.model.position import sincos_2d_table
from vit_lightning.run.transfer import Source, read_source, start_from

OLD = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, width=32, depth=2, heads=2, mlp_dim=64)


def source_of(**options) -> tuple[ViT, Source]:
    """A random micro ViT at 28 px (4 x 4 grid) with non-trivial tables, as a Source."""
    torch.manual_seed(0)
    old = ViT(**OLD, **options)
    for p in old.parameters():
        p.data.normal_(0, 0.1)
    return old, Source({**OLD, **options}, old.state_dict(), {"source": "test"})


def grid_image(rows: torch.Tensor, grid=(4, 4)) -> torch.Tensor:
    """(N, D) patch rows in raster order -> (1, D, H, W), the table as an image on the patch grid."""
    return rows.T.reshape(1, -1, *grid)


@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "nearest"])
def test_learned_tables_are_interpolated_on_the_patch_grid(mode):
    corners = None if mode == "nearest" else False
    old, source = source_of(pos_encoding="learned_1d", pos_injection="every_layer")
    new = ViT(**{**OLD, "img_size": 56}, pos_encoding="learned_1d", pos_injection="every_layer")
    start_from(new, source, mode)
    for part_old, part_new in zip(old.pos.parts, new.pos.parts, strict=True):  # one table per layer
        table = part_old.table.detach()
        want = F.interpolate(grid_image(table[1:]), size=(8, 8), mode=mode, align_corners=corners,
                             antialias=mode != "nearest")  # as timm and jax.image.resize
        torch.testing.assert_close(part_new.table[0], table[0])  # the [class] embedding is kept
        torch.testing.assert_close(part_new.table[1:], want[0].flatten(1).T)

    old, source = source_of(pos_encoding="learned_2d")
    new = ViT(**{**OLD, "img_size": (56, 84)}, pos_encoding="learned_2d")
    start_from(new, source, mode)
    one_axis = "nearest" if mode == "nearest" else "linear"  # each table is 1-D: X along columns, Y along rows
    for name, size in (("x_table", 12), ("y_table", 8)):
        table = getattr(old.pos.parts[0], name).detach()
        kwargs = {} if one_axis == "nearest" else {"align_corners": False}
        want = F.interpolate(table.T[None], size=size, mode=one_axis, **kwargs)[0].T
        torch.testing.assert_close(getattr(new.pos.parts[0], name), want)


@pytest.mark.parametrize("mode", ["bicubic", "nearest"])
def test_relative_bias_table_is_interpolated_and_sincos_recomputed(mode):
    corners = None if mode == "nearest" else False
    old, source = source_of(pos_encoding="relative_bias_2d")
    new = ViT(**{**OLD, "img_size": 56}, pos_encoding="relative_bias_2d")
    start_from(new, source, mode)
    for part_old, part_new in zip(old.pos.parts, new.pos.parts, strict=True):
        want = F.interpolate(part_old.table.detach()[None], size=(15, 15), mode=mode, align_corners=corners,
                             antialias=mode != "nearest")[0]
        torch.testing.assert_close(part_new.table, want)
    _, source = source_of(pos_encoding="sincos_2d", pooling="gap")
    new = ViT(**{**OLD, "img_size": 56}, pos_encoding="sincos_2d", pooling="gap")
    start_from(new, source, mode)
    torch.testing.assert_close(new.pos.parts[0].table, sincos_2d_table((8, 8), 32))


def test_relative_1d_keeps_each_2d_offset_and_none_copies_everything_else():
    old, source = source_of(pos_encoding="relative_1d")
    new = ViT(**{**OLD, "img_size": 56}, pos_encoding="relative_1d")
    start_from(new, source)
    t_old, t_new = old.pos.parts[0].table.detach(), new.pos.parts[0].table.detach()  # (2N-1, hd): offset d at d+N-1
    for dy, dx in ((0, 0), (0, 1), (1, 0), (-2, 3), (3, -3)):  # offsets both grids have
        torch.testing.assert_close(t_new[dy * 8 + dx + 63], t_old[dy * 4 + dx + 15])
    old, source = source_of(pos_encoding="none", pooling="gap")
    new = ViT(**{**OLD, "img_size": 56}, pos_encoding="none", pooling="gap")
    start_from(new, source)
    x = torch.randn(2, 1, 28, 28)
    patches = x.reshape(2, 1, 4, 7, 4, 7).repeat_interleave(2, dim=2).repeat_interleave(2, dim=4)
    big = patches.reshape(2, 1, 56, 56)  # every patch twice along each axis: four copies of each token
    # a bag of patches without position: four copies of every token change no attention weight nor the mean
    with torch.no_grad():
        torch.testing.assert_close(new(big), old(x), atol=1e-5, rtol=1e-4)


def test_a_new_number_of_classes_or_new_head_gives_a_zero_head():
    old, source = source_of()
    new = ViT(**{**OLD, "num_classes": 3})
    start_from(new, source)
    assert new.head.weight.abs().sum() == 0 and new.head.bias.abs().sum() == 0
    torch.testing.assert_close(new.blocks[0].attn.qkv.weight, old.blocks[0].attn.qkv.weight)
    same = ViT(**OLD)
    start_from(same, source, new_head=True)
    assert same.head.weight.abs().sum() == 0
    start_from(same, source)
    torch.testing.assert_close(same.head.weight, old.head.weight)


def test_a_timm_vit_from_a_local_file_gives_timm_logits_also_at_a_new_resolution(tmp_path):
    timm = pytest.importorskip("timm")
    from timm.layers import resample_abs_pos_embed

    torch.manual_seed(0)
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10).eval()
    for p in reference.parameters():
        p.data.normal_(0, 0.05)
    weights = tmp_path / "vit_tiny.pth"
    torch.save(reference.state_dict(), weights)
    source = read_source(f"timm:vit_tiny_patch16_224@{weights}")
    assert source.options["width"] == 192 and source.account["sha256"]
    ours = ViT(**source.options).eval()
    start_from(ours, source)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-4, rtol=1e-4)

    # at 288 px (an 18 x 18 grid): timm resamples its own table; both must give the same logits
    bigger = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=288).eval()
    state = dict(reference.state_dict())
    state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], new_size=(18, 18), num_prefix_tokens=1)
    bigger.load_state_dict(state)
    ours = ViT(**{**source.options, "img_size": 288}).eval()
    start_from(ours, source)
    x = torch.randn(2, 3, 288, 288)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), bigger(x), atol=1e-4, rtol=1e-4)


# ---- fit and eval from a run ---------------------------------------------------------------------

TINY = [*TINY_MODEL, "--data.batch_size=32", "--trainer.max_epochs=1", "--trainer.limit_val_batches=8",
        "--run.wandb=off", "--run.fewshot_shots=[]"]
ENCODINGS = ["none", "learned_1d", "learned_2d", "sincos_2d", "relative_1d", "relative_bias_2d", "rope_mixed", "alibi_2d",
             "peg"]


def fit(root, *argv) -> int:
    return train.main([*TINY, f"--run.root={root}", *argv])


def only_record(root, trial: str | None = None) -> dict:
    paths = sorted(root.glob(f"adhoc/local/{trial or 'ft-*'}/results.json"))
    assert len(paths) == 1, paths
    return json.loads(paths[0].read_text())


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_fine_tuning_at_56_px_from_a_28_px_run_reaches_the_source_accuracy(encoding, tmp_path):
    pooling = "gap" if encoding == "sincos_2d" else "cls"
    deeper = ["--model.depth=2"] if encoding == "peg" else []  # peg acts after block 0 (TINY has one block)
    # A short source run (40 steps at 28 px), then two epochs at 56 px: at 56 px without fine-tuning the 4 x 4
    # grid's tables are stretched over an 8 x 8 grid of half-size patches, so fine-tuning must first recover.
    src = ["--trainer.limit_train_batches=40", f"--model.pos_encoding={encoding}", f"--model.pooling={pooling}",
           "--model.warmup_epochs=0.1", *deeper]
    assert fit(tmp_path, *src, "--run.trial=src") == 0
    source = only_record(tmp_path, "src")
    ft = [f"--model.init_from={tmp_path / 'adhoc/local/src'}", "--data.img_size=56", "--trainer.max_epochs=2",
          "--model.warmup_epochs=0.1", *deeper]
    assert fit(tmp_path, *ft) == 0
    tuned = only_record(tmp_path)
    assert tuned["config"]["model.pos_encoding"] == encoding and tuned["config"]["model.width"] == 32  # from the source
    assert tuned["init_from"]["trial"] == "src" and len(tuned["init_from"]["sha256"]) == 64
    assert tuned["init_from"]["config"]["model.pos_encoding"] == encoding
    assert tuned["init_from"]["pos_resize"]["img_size"] == {"from": 28, "to": 56}  # what was done, in words
    assert tuned["init_from"]["pos_resize"]["done"].startswith(f"{encoding}: ")
    assert tuned["metrics"]["val/acc"] >= source["metrics"]["val/acc"], (tuned["metrics"], source["metrics"])
    assert tuned["metrics"]["transfer/source_acc"] == source["metrics"]["val/acc_best"]
    assert 0 < tuned["metrics"]["transfer/start_acc"] < 1  # at 56 px before fine-tuning
    assert fit(tmp_path, *ft) == 0  # the same command finds the same (finished) run
    assert only_record(tmp_path)["finished_at"] == tuned["finished_at"]


@pytest.mark.slow
def test_eval_at_another_resolution_writes_a_record(tmp_path, capsys):
    assert fit(tmp_path, "--trainer.limit_train_batches=5", "--run.trial=src") == 0
    run = tmp_path / "adhoc/local/src"
    assert cli.main(["eval", str(run), "--data.img_size=56", "--shots", "1", "--into-record"]) == 0
    out = json.loads((run / "eval-mnist5k-56px.json").read_text())
    m = out["metrics"]
    assert 0 <= m["val/acc"] <= m["val/acc5"] <= 1 and m["val/loss"] > 0 and "val/fewshot1" in m
    assert out["img_size"] == 56 and out["source"]["trial"] == "src"
    assert json.loads((run / "results.json").read_text())["eval"]["mnist5k@56px/both"] == {**m, **out["attention"]}
    # at the source's own resolution, eval's top-1 is the run's own validation accuracy (same split, same weights)
    assert cli.main(["eval", str(run), "--shots", "--out", str(tmp_path / "e.json")]) == 0
    fitted = json.loads((run / "results.json").read_text())["metrics"]["val/acc"]
    # fit validated 8 batches of 32: the same batches through eval's loop give fit's number
    from vit_lightning.analysis.evaluate import accuracy
    from vit_lightning.analysis.trained import load_trained

    trained = load_trained(run, batch_size=32)
    loader = trained.data.val_dataloader()
    first = [batch for _, batch in zip(range(8), loader, strict=False)]
    assert accuracy(trained.model.model, first)["val/acc"] == pytest.approx(fitted)


@pytest.mark.slow
def test_bad_sources_are_one_line_before_anything_is_written(tmp_path, capsys):
    assert fit(tmp_path, "--trainer.limit_train_batches=2", "--run.trial=src") == 0
    src = tmp_path / "adhoc/local/src"
    unfinished = tmp_path / "adhoc/local/unfinished"
    unfinished.mkdir()
    (unfinished / "last.ckpt").write_bytes((src / "last.ckpt").read_bytes())
    record = json.loads((src / "results.json").read_text())
    (unfinished / "results.json").write_text(json.dumps({**record, "status": "running"}))
    capsys.readouterr()
    cases = {
        f"--model.init_from={tmp_path / 'nowhere'}": "no checkpoint at",
        f"--model.init_from={unfinished}": "did not finish",
        "--model.init_from=timm:vit_tiny_patch16_224@/no/such/file.pth": "no weights file",
    }
    for arg, words in cases.items():
        before = sorted(tmp_path.rglob("*"))
        assert train.main([arg, f"--run.root={tmp_path}", "--run.wandb=off"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert sorted(tmp_path.rglob("*")) == before
    for args, words in ((["--model.patch_size=5"], "not divisible by patch_size=5"),
                        (["--model.pos_encoding=none"], "model.pos_encoding='none' (the source has 'learned_1d')"),
                        (["--model.arch=swin"], "model.arch='swin' (the source has 'vit')")):
        assert train.main([f"--model.init_from={src}", *args, f"--run.root={tmp_path}", "--run.wandb=off"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    timm = pytest.importorskip("timm")
    weights = tmp_path / "rgb.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict(), weights)
    assert train.main([f"--model.init_from=timm:vit_tiny_patch16_224@{weights}", "--data.img_size=32", f"--run.root={tmp_path}",
                       "--run.wandb=off"]) == 2  # mnist5k has one channel
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "3-channel images, the data has 1 channels" in err[0], err
    assert cli.main(["eval", str(unfinished)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not finish" in err[0]
    assert sorted(p.name for p in (tmp_path / "adhoc/local").iterdir()) == ["src", "unfinished"]


def test_a_swin_source_is_refused_in_one_line(tmp_path, capsys):
    from vit_lightning.run.module import Classifier

    swin = Classifier(arch="swin", variant="micro", patch_size=2, img_size=28, in_chans=1, num_classes=10)
    torch.save({"state_dict": swin.state_dict(), "hyper_parameters": dict(swin.hparams)}, tmp_path / "swin.ckpt")
    assert train.main([f"--model.init_from={tmp_path / 'swin.ckpt'}", f"--run.root={tmp_path}", "--run.wandb=off"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a swin source cannot start a run" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["swin.ckpt"]

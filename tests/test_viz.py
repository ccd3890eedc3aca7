"""The analysis figures: their numbers against hand computations, and `vit-ablate viz` end to end."""

import json
import math

import matplotlib.image
import numpy as np
import pytest
import torch

from vit_lightning.ablation import METRIC, Ablation, profile
from vit_lightning.commands.fit import main as train
from vit_lightning.commands.results.tables import figure_runs
from vit_lightning.commands.viz import analysis, write_ablation_figures
from vit_lightning.commands.viz.ablation import pick_runs
from vit_lightning.commands.viz.cli import main as viz
from vit_lightning.commands.viz.figures import similarity_mosaic
from vit_lightning.commands.viz.run import Run, compute, draw, load_run
from vit_lightning.model import ViT
from vit_lightning.records.store import collect

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = {"model.width": 32, "model.depth": 2, "model.heads": 2, "model.mlp_dim": 64, "data.batch_size": 16,
        "trainer.max_epochs": 1, "trainer.limit_train_batches": 2, "trainer.limit_val_batches": 1,
        "trainer.num_sanity_val_steps": 0, "trainer.enable_model_summary": False}


def naive_mean_pairwise_distance(grid, stride):
    h, w = grid
    cells = [(r, c) for r in range(h) for c in range(w)]
    return sum(stride * math.hypot(r1 - r2, c1 - c2) for r1, c1 in cells for r2, c2 in cells) / len(cells) ** 2


def test_uniform_attention_gives_the_mean_pairwise_patch_distance():
    grid, stride, prefix = (3, 4), 5.0, 1
    t = prefix + grid[0] * grid[1]
    maps = [torch.full((2, 3, t, t), 1.0 / t) for _ in range(2)]  # 2 layers, 2 images, 3 heads
    dist = analysis.mean_attention_distance(maps, grid, stride, prefix)
    assert dist.shape == (2, 3)
    assert torch.allclose(dist, torch.full((2, 3), naive_mean_pairwise_distance(grid, stride), dtype=dist.dtype))


def test_attention_to_self_only_gives_zero_distance():
    t = 1 + 16
    maps = [torch.eye(t).expand(2, 4, t, t) for _ in range(3)]
    assert analysis.mean_attention_distance(maps, (4, 4), 7.0, 1).abs().max() == 0


def test_attention_distance_matches_a_loop_over_queries_and_keys():
    grid, stride, prefix = (2, 3), 16.0, 1
    t = prefix + 6
    probs = torch.randn(2, 2, t, t, generator=torch.Generator().manual_seed(0)).softmax(-1)  # (B, h, T, T)
    want = torch.zeros(2)
    for b in range(2):
        for head in range(2):
            for i in range(6):
                row = probs[b, head, prefix + i, prefix:]
                row = row / row.sum()  # attention to the [class] token has no distance: renormalised away
                want[head] += sum(row[j] * stride * math.hypot(i // 3 - j // 3, i % 3 - j % 3) for j in range(6))
    got = analysis.mean_attention_distance([probs], grid, stride, prefix)
    assert torch.allclose(got[0], want.double() / (2 * 6))


def test_rollout_through_identity_layers_is_the_identity():
    t = 5
    maps = [torch.eye(t).expand(2, 3, t, t) for _ in range(4)]
    assert torch.equal(analysis.attention_rollout(maps), torch.eye(t, dtype=torch.float64).expand(2, t, t))


def test_rollout_multiplies_the_layers_later_on_the_left():
    gen = torch.Generator().manual_seed(1)
    a1, a2 = (torch.randn(1, 2, 4, 4, generator=gen).softmax(-1).double() for _ in range(2))
    step = [(a.mean(1) + torch.eye(4)) / 2 for a in (a1, a2)]  # head mean + identity, rows sum to 2
    assert torch.allclose(analysis.attention_rollout([a1, a2]), step[1] @ step[0])
    grid = analysis.rollout_on_grid(analysis.attention_rollout([a1, a2]), (1, 3), num_prefix=1)
    assert torch.allclose(grid[0, 0], (step[1] @ step[0])[0, 0, 1:])  # CLS: the class token's row
    gap = analysis.rollout_on_grid(analysis.attention_rollout([a1]), (2, 2), num_prefix=0)
    assert torch.allclose(gap[0].flatten(), step[0][0].mean(0))  # GAP: the mean of the patch rows


def test_learned_2d_with_identical_rows_is_fully_similar_along_each_column():
    vit = ViT("micro", img_size=28, in_chans=1, num_classes=10, patch_size=7, pos_encoding="learned_2d")
    with torch.no_grad():
        vit.pos.parts[0].y_table.copy_(vit.pos.parts[0].y_table[:1].expand(4, -1))  # every row the same
    [table] = analysis.position_tables(vit)
    assert table.shape == (16, 64)  # prefix row dropped, X and Y halves concatenated
    sim = analysis.cosine_similarity(table)
    for i in range(16):
        for j in range(16):
            if i % 4 == j % 4:  # same column
                assert sim[i, j] == pytest.approx(1.0)
            else:
                assert sim[i, j] < 0.999


def test_sincos_2d_similarity_is_symmetric_and_peaks_on_the_diagonal():
    vit = ViT("micro", img_size=32, in_chans=3, num_classes=10, patch_size=4, pos_encoding="sincos_2d")
    [table] = analysis.position_tables(vit)
    sim = analysis.cosine_similarity(table)
    assert sim.shape == (64, 64)
    assert torch.allclose(sim, sim.T)
    assert torch.allclose(sim.diagonal(), torch.ones(64, dtype=sim.dtype))
    off_diagonal = sim.masked_fill(torch.eye(64, dtype=torch.bool), -2)
    assert (off_diagonal.max(dim=1).values < 1 - 1e-6).all()


def test_every_layer_has_a_table_per_layer_and_none_has_none():
    vit = ViT("micro", img_size=28, in_chans=1, patch_size=7, pos_encoding="learned_1d", pos_injection="every_layer")
    assert len(analysis.position_tables(vit)) == 4
    assert analysis.position_tables(ViT("micro", img_size=28, in_chans=1, patch_size=7, pos_encoding="none")) is None


def test_relative_bias_2d_is_its_table():
    vit = ViT("micro", img_size=28, in_chans=1, patch_size=7, pos_encoding="relative_bias_2d")
    bias = analysis.relative_bias(vit)
    assert bias.shape == (4, 4, 7, 7)
    assert torch.equal(bias[2], vit.pos.parts[2].table.double())


def test_relative_1d_bias_is_what_the_zero_content_query_adds_at_each_2d_offset():
    vit = ViT("micro", img_size=28, in_chans=1, patch_size=7, pos_encoding="relative_1d").double()
    with torch.no_grad():  # a non-zero LN bias and query bias, as after training
        for p in (vit.blocks[1].norm1.bias, vit.blocks[1].attn.qkv.bias):
            p.normal_(generator=torch.Generator().manual_seed(2))
    bias = analysis.relative_bias(vit)[1]  # (heads, 7, 7)
    block, part = vit.blocks[1], vit.pos.parts[1]
    q = block.attn.qkv(block.norm1.bias)[:64].view(4, 16)  # the query of a token with zero normalised content
    t = 17
    logits = part(q[None, :, None, :].expand(1, 4, t, 16))  # the encoding's own (1, h, T, T) bias
    for i in range(16):
        for j in range(16):
            dr, dc = i // 4 - j // 4, i % 4 - j % 4
            assert torch.allclose(bias[:, dr + 3, dc + 3], logits[0, :, 1 + i, 1 + j])


@pytest.mark.parametrize("scale", ["sqrt_d", "none"])
def test_relative_1d_bias_with_images_is_q_dot_r_averaged_over_their_patch_queries(scale):
    torch.manual_seed(0)
    vit = ViT("micro", img_size=28, in_chans=1, patch_size=7, pos_encoding="relative_1d", relative_scale=scale)
    vit = vit.double().eval()
    images = torch.randn(5, 1, 28, 28, dtype=torch.float64)
    with torch.no_grad():
        bias = analysis.relative_bias(vit, images, chunk=2)  # (L, heads, 7, 7)
        x = vit.pool.prepend(vit.stem(images))  # (5, 17, 64): the first block's input (no absolute table)
        for layer, (block, part) in enumerate(zip(vit.blocks, vit.pos.parts)):
            q = block.attn.qkv(block.norm1(x))[..., :64].view(5, 17, 4, 16)[:, 1:]  # (B, N, heads, hd) patch queries
            for dr in range(-3, 4):
                for dc in range(-3, 4):
                    r = part.table[dr * 4 + dc + 15]  # raster offset dr * W + dc
                    expected = (q @ r).mean(dim=(0, 1)) / (4.0 if scale == "sqrt_d" else 1.0)  # (heads,)
                    torch.testing.assert_close(bias[layer, :, dr + 3, dc + 3], expected)
            x = block(x, part)


def test_filter_components_match_the_covariance_eigenvectors():
    gen = torch.Generator().manual_seed(3)
    basis = torch.linalg.qr(torch.randn(12, 3, generator=gen, dtype=torch.float64))[0].T  # (3, 12) orthonormal
    coeffs = torch.randn(40, 3, generator=gen, dtype=torch.float64) * torch.tensor([3.0, 2.0, 0.5], dtype=torch.float64)
    filters = (coeffs @ basis + 7.0).reshape(40, 3, 2, 2)  # a shared mean the PCA must remove
    comps, ratios = analysis.filter_components(filters, 5)
    centred = (coeffs - coeffs.mean(0)) @ basis
    values, vectors = np.linalg.eigh((centred.T @ centred).numpy())  # ascending
    for k in range(3):
        want = vectors[:, -1 - k]
        got = comps[k].flatten().numpy()
        assert abs(abs(got @ want) - 1) < 1e-9  # the same direction, up to sign
        assert got[np.abs(got).argmax()] > 0  # the sign rule
        assert ratios[k].item() == pytest.approx(values[-1 - k] / values.sum())
    assert comps.shape == (5, 3, 2, 2) and ratios[3:].sum() < 1e-12  # rank 3


def test_similarity_mosaic_puts_each_query_at_its_own_tile():
    sim = np.arange(36.0).reshape(6, 6)  # grid (2, 3): query q's row is 6q .. 6q+5
    mosaic = similarity_mosaic(sim, (2, 3))
    assert mosaic.shape == (2 * 3 - 1, 3 * 4 - 1)
    assert np.array_equal(mosaic[3:5, 4:7], sim[4].reshape(2, 3))  # query (1, 1)
    assert np.isnan(mosaic[2]).all() and np.isnan(mosaic[:, 3]).all()  # the gaps


def test_hybrid_relative_run_draws_in_stem_pixels_and_notes_the_missing_filters(tmp_path):
    vit = ViT("micro", img_size=32, in_chans=3, num_classes=10, stem="hybrid", hybrid_layers=(1, 1), hybrid_width=32,
              depth=2, pos_encoding="relative_bias_2d").double().eval()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    numbers = compute(Run(vit, images, None, tmp_path))
    assert numbers.grid == (4, 4) and numbers.stride == 8.0  # root conv, max-pool and one strided stage
    maps = vit.attention_maps(images)
    assert np.allclose(numbers.distance, analysis.mean_attention_distance(maps, (4, 4), 8.0, 1).numpy())
    names = {p.name for p in draw(numbers, tmp_path)}
    assert {"pos_bias.png", "patch_pca.txt", "attention_distance.png", "rollout.png"} <= names
    assert "pos_similarity.png" not in names
    assert len((tmp_path / "pos_bias.csv").read_text().splitlines()) == 1 + 2 * 4 * 7 * 7  # layers x heads x offsets
    assert (tmp_path / "patch_pca.txt").read_text().strip() == (  # the family's note, as the figures wrote it before
        "stem=hybrid: the patch embedding is a 1x1 projection of ResNet features, so there are no pixel filters to draw")
    assert numbers.title == "relative_bias_2d (stem), cls"


def test_alibi_bias_by_offset_is_minus_slope_times_length_and_the_same_in_every_layer():
    vit = ViT("micro", img_size=(28, 21), in_chans=1, patch_size=7, pos_encoding="alibi_2d")  # a 4 x 3 grid
    bias = analysis.relative_bias(vit)
    assert bias.shape == (1, 4, 7, 5)  # one row for every layer, 4 heads, (2H-1, 2W-1) offsets
    q = torch.zeros(1, 4, 13, 16)
    logits = vit.pos.parts[3](q)[0].double()  # the last block's own (h, T, T) bias
    for i in range(12):
        for j in range(12):
            dr, dc = i // 3 - j // 3, i % 3 - j % 3
            torch.testing.assert_close(bias[0, :, dr + 3, dc + 2], logits[:, 1 + i, 1 + j])
            slopes = torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8], dtype=torch.float64)
            torch.testing.assert_close(bias[0, :, dr + 3, dc + 2], -slopes * math.hypot(dr, dc))


@pytest.mark.parametrize("encoding,injection,figure", [("alibi_2d", "stem", "pos_bias"), ("peg", "stem", "peg_kernels"),
                                                       ("peg", "every_layer", "peg_kernels")])
def test_alibi_and_peg_draw_their_figures_attention_distance_and_rollout(encoding, injection, figure, tmp_path):
    torch.manual_seed(0)
    vit = ViT("micro", img_size=28, in_chans=1, patch_size=7, depth=3, pos_encoding=encoding,
              pos_injection=injection).double().eval()
    images = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    numbers = compute(Run(vit, images, None, tmp_path))
    maps = vit.attention_maps(images)
    assert np.allclose(numbers.distance, analysis.mean_attention_distance(maps, (4, 4), 7.0, 1).numpy())
    names = {p.name for p in draw(numbers, tmp_path)}
    assert {f"{figure}.png", f"{figure}.csv", "attention_distance.png", "rollout.png", "patch_pca.png"} <= names
    read_png(tmp_path / f"{figure}.png")
    if encoding == "peg":  # one PEG after block 0, or one after every block but the last
        pegs = 1 if injection == "stem" else 2
        rows = (tmp_path / "peg_kernels.csv").read_text().splitlines()
        assert rows[0] == "after_block,channel,d_row,d_col,weight" and len(rows) == 1 + pegs * 64 * 9
        weight = vit.pos.parts[pegs - 1].proj.weight[5, 0, 0, 2].item()  # channel 5, one row up, one column right
        assert f"{pegs},5,-1,1,{weight:.6g}" in rows
        assert "see peg_kernels.png" in (tmp_path / "pos_similarity.txt").read_text()
    else:
        assert len((tmp_path / "pos_bias.csv").read_text().splitlines()) == 1 + 4 * 7 * 7  # one row of heads


# ---- end to end: short fits, then the command ---------------------------------------------------

GRIDS = {"model.pos_encoding": ["none", "learned_1d", "relative_bias_2d"], "model.pos_injection": ["stem"]}
TINY_ABLATION = Ablation(
    name="tiny_pos", title="t", source="s", finding="f", metric=METRIC, rows="model.pos_encoding",
    cols="model.pos_injection", reference={}, reference_note="",
    profiles={"demo": profile("demo", GRIDS, fixed=TINY, seeds=(0,))},
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Short fits of the tiny ablation's none and learned_1d cells (relative_bias_2d is left unrun)."""
    root = tmp_path_factory.mktemp("runs")
    for trial in TINY_ABLATION.trials("demo")[:2]:
        argv = [f"--{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in trial.items()]
        assert train.main([*argv, f"--run.root={root}", "--run.wandb=off", "--trainer.accelerator=cpu"]) == 0
    return root


def run_dir(runs, encoding):
    [path] = (runs / "tiny_pos" / "demo").glob(f"*-{encoding}-*/results.json")
    return path.parent


def read_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    return data


@pytest.mark.slow
def test_viz_draws_every_figure_of_a_short_fit_reproducibly(runs, tmp_path):
    run = run_dir(runs, "learned_1d")
    assert viz([str(run), "--out", str(tmp_path / "a"), "--images", "5"]) == 0
    names = {"pos_similarity", "attention_distance", "rollout", "patch_pca"}
    for name in names:
        read_png(tmp_path / "a" / f"{name}.png")
    rows = (tmp_path / "a" / "attention_distance.csv").read_text().splitlines()
    assert rows[0] == "layer,head,distance_px" and len(rows) == 1 + 2 * 2  # depth x heads
    assert len((tmp_path / "a" / "pos_similarity.csv").read_text().splitlines()) == 1 + 16 * 16
    assert viz([str(run / "last.ckpt"), "--out", str(tmp_path / "b"), "--images", "5"]) == 0
    for path in (tmp_path / "a").iterdir():  # committed figures are regenerated byte for byte
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


@pytest.mark.slow
def test_viz_distances_agree_with_the_model_attention(runs):
    run = load_run(run_dir(runs, "learned_1d"), images=3)
    maps = run.vit.attention_maps(run.images)
    want = analysis.mean_attention_distance(maps, (4, 4), 7.0, num_prefix=1).numpy()
    assert np.allclose(compute(run, chunk=2).distance, want)  # chunked averaging = one pass


@pytest.mark.slow
def test_viz_of_none_says_there_is_nothing_to_draw(runs, tmp_path, capsys):
    assert viz([str(run_dir(runs, "none")), "--out", str(tmp_path), "--images", "0"]) == 0
    assert not (tmp_path / "pos_similarity.png").exists()
    assert "no position embedding" in (tmp_path / "pos_similarity.txt").read_text()
    assert "no position embedding" in capsys.readouterr().out
    read_png(tmp_path / "patch_pca.png")


@pytest.mark.parametrize("damage", ["missing", "corrupt", "not_a_checkpoint"])
def test_a_bad_checkpoint_is_a_one_line_error(damage, tmp_path, capsys):
    ckpt = tmp_path / "last.ckpt"
    if damage == "corrupt":
        ckpt.write_bytes(b"PK\x03\x04 this is not a checkpoint")
    elif damage == "not_a_checkpoint":
        torch.save({"weights": torch.zeros(2)}, ckpt)
    assert viz([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit-ablate viz: error:") and err.count("\n") == 1 and str(ckpt) in err
    assert not (tmp_path / "out").exists()


def table_runs(runs, out):
    """Per cell, the runs the table of the records collected from runs averages (the figures' candidates)."""
    collect(runs, "tiny_pos", "demo", out / "records")
    return figure_runs(TINY_ABLATION, TINY_ABLATION.profile("demo"), out)


@pytest.mark.slow
def test_ablation_figures_one_run_per_variant_and_the_comparisons(runs, tmp_path):
    candidates = table_runs(runs, tmp_path)
    assert [len(names) for names in candidates] == [1, 1, 0]  # relative_bias_2d was not run
    paths, notes = write_ablation_figures(TINY_ABLATION, "demo", runs, tmp_path, candidates, images=4)
    assert notes == ["figures: no checkpoint for relative_bias_2d-stem"]
    for name in ("pos_similarity", "attention_distance"):
        read_png(tmp_path / f"{name}.png")
        assert tmp_path / f"{name}.csv" in paths
    distance = (tmp_path / "attention_distance.csv").read_text().splitlines()
    assert {row.split(",")[0] for row in distance[1:]} == {"none", "learned_1d"}
    assert (tmp_path / "figures" / "learned_1d-stem" / "pos_similarity.png").is_file()
    assert (tmp_path / "figures" / "none-stem" / "pos_similarity.txt").is_file()
    empty = tmp_path / "no-runs"
    assert write_ablation_figures(TINY_ABLATION, "demo", empty, tmp_path / "x", candidates) == (
        [], [f"figures: no completed run with last.ckpt and the profile's settings under "
             f"{empty / 'tiny_pos' / 'demo'} (results/ keeps records only); the figures in {tmp_path / 'x'} were "
             "left as they are"])


@pytest.mark.slow
def test_figures_draw_only_runs_the_table_uses_first_with_a_checkpoint(runs, tmp_path):
    none, learned, _ = table_runs(runs, tmp_path)
    demo = TINY_ABLATION.profile("demo")
    chosen = pick_runs(demo, runs / "tiny_pos" / "demo", [[], ["gone", *learned], []])
    assert chosen["none-stem"][1] is None  # its run exists, but the table does not use it
    assert chosen["learned_1d-stem"][1] == run_dir(runs, "learned_1d")  # the first candidate has no checkpoint


@pytest.mark.slow
def test_figures_go_to_the_runs_offline_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SWEEP_ID", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    argv = [f"--{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in TINY.items()]
    assert train.main([*argv, "--run.wandb=offline", "--run.wandb_project=p", "--trainer.accelerator=cpu"]) == 0
    [record] = tmp_path.glob("runs/*/*/*/results.json")
    run_id = json.loads(record.read_text())["wandb"]["run_id"]
    assert viz([str(record.parent), "--images", "2"]) == 0
    logged = sorted(p.name for p in record.parent.glob(f"wandb/offline-run-*-{run_id}/files/media/images/viz/*.png"))
    assert [name.split("_")[0] for name in logged] == ["attention", "patch", "pos", "rollout"]

"""Evaluation views at a target side: tokens (the trained pixel scale, a larger field), zoom (the trained canvas and
token count, the content scaled) and both (resized, the published protocol), each image checked against a naive
reference; and a tiny translated_mnist run evaluated under all three into its record and its table."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from test_results import md_cells, table, write_run

from vit_lightning.ablation import Ablation, Profile
from vit_lightning.analysis.evaluate import viewed_data
from vit_lightning.analysis.trained import build_data
from vit_lightning.core.evalkey import EvalKey, parse
from vit_lightning.data.sources import read_mnist5k, stratified_split
from vit_lightning.data.views import geometry

ENC = "model.pos_encoding"


def first_batch(datamodule) -> torch.Tensor:
    """The first validation batch, back in pixel units (0-255 floats) from the normalised images."""
    x = next(iter(datamodule.val_dataloader()))[0]
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) * 255 for v in datamodule.source.stats)
    return x * std + mean


def naive_centre(images: np.ndarray, side: int) -> np.ndarray:
    """(N, C, h, w) on a zero (N, C, side, side) canvas, by index arithmetic: the centre kept, the odd pixel after."""
    n, c, h, w = images.shape
    out = np.zeros((n, c, side, side), dtype=images.dtype)
    sy, sx = (h - side) // 2 if h > side else 0, (w - side) // 2 if w > side else 0  # crop start
    dy, dx = (side - h) // 2 if side > h else 0, (side - w) // 2 if side > w else 0  # paste start
    ch, cw = min(h, side), min(w, side)
    out[:, :, dy:dy + ch, dx:dx + cw] = images[:, :, sy:sy + ch, sx:sx + cw]
    return out


def resized(images: np.ndarray, side: int) -> np.ndarray:
    """The images resized as every loader resizes (bilinear, antialiased), or as they are at that side."""
    x = torch.from_numpy(images).float()
    if x.shape[-1] != side:
        x = F.interpolate(x, size=(side, side), mode="bilinear", antialias=True, align_corners=False)
    return x.numpy()


def test_each_view_is_two_steps_resize_then_centre():
    assert geometry("tokens", 28, 56) == (28, 56)  # the trained scale on the target canvas
    assert geometry("zoom", 28, 56) == (56, 28)  # the content at 2x on the trained canvas
    assert geometry("both", 28, 21) == (21, 21)  # resized
    with pytest.raises(ValueError, match="unknown view 'crop'; valid: tokens, zoom, both"):
        geometry("crop", 28, 56)


def mnist_val(count: int) -> np.ndarray:
    """mnist5k's first `count` validation digits (split seed 0), uint8 as float (N, 1, 28, 28)."""
    x, y = read_mnist5k()
    _, val = stratified_split(y, 0.2, 0)
    return x[val[:count]].numpy().astype(np.float32)


@pytest.mark.parametrize("target", [56, 21, 35])
def test_stored_digits_meet_each_view_as_the_naive_reference_has_them(target):
    """mnist5k, trained at its 28 px: tokens pads (or crops) the digit at its scale, zoom resizes it to the target and
    centres it on 28 px (4 x 4 patches of 7 still), both resizes; tokens is data.resize=pad, both the plain resize."""
    raw = mnist_val(16)
    seen = {}
    for view in ("tokens", "zoom", "both"):
        dm = viewed_data({"name": "mnist5k", "batch_size": 16}, {"img_size": target}, view, 28)
        seen[view] = first_batch(dm).numpy()
        assert dm.img_size == seen[view].shape[-1]
    np.testing.assert_allclose(seen["tokens"], naive_centre(raw, target), atol=1e-3)
    np.testing.assert_allclose(seen["zoom"], naive_centre(resized(raw, target), 28), atol=1e-3)
    np.testing.assert_allclose(seen["both"], resized(raw, target), atol=1e-3)
    assert seen["zoom"].shape[-1] == 28 and seen["tokens"].shape[-1] == seen["both"].shape[-1] == target
    if target > 28:  # the views the data offered before: a padded canvas, a resize
        pad = first_batch(build_data({"name": "mnist5k", "batch_size": 16}, img_size=target, resize="pad")).numpy()
        np.testing.assert_allclose(seen["tokens"], pad, atol=1e-3)
    plain = first_batch(build_data({"name": "mnist5k", "batch_size": 16}, img_size=target)).numpy()
    np.testing.assert_allclose(seen["both"], plain, atol=1e-3)


def test_a_drawn_dataset_draws_the_tokens_view_and_resizes_its_trained_canvas_for_zoom_and_both():
    """translated_mnist trained at 42 px, viewed at 56: tokens draws each digit at its own 28 px anywhere on a 56
    canvas (a larger field); zoom and both resize the 42 px canvas to 56, zoom then keeping its centre 42."""
    options = {"name": "translated_mnist", "batch_size": 16, "img_size": 42}
    trained = first_batch(build_data(options)).numpy()  # the canvases as the run saw them
    zoom = first_batch(viewed_data(options, {"img_size": 56}, "zoom", 42)).numpy()
    both = first_batch(viewed_data(options, {"img_size": 56}, "both", 42)).numpy()
    np.testing.assert_allclose(both, resized(trained, 56), atol=1e-3)
    np.testing.assert_allclose(zoom, naive_centre(resized(trained, 56), 42), atol=1e-3)
    dm = viewed_data(options, {"img_size": 56}, "tokens", 42)
    tokens = first_batch(dm).numpy()
    digits = mnist_val(16)
    for image, digit, (top, left) in zip(tokens[:, 0], digits[:, 0], dm.val_set.offsets[:16].tolist()):
        assert image.shape == (56, 56) and 0 <= top <= 28 and 0 <= left <= 28
        np.testing.assert_allclose(image[top:top + 28, left:left + 28], digit, atol=1e-3)  # at its own scale
        rest = image.copy()
        rest[top:top + 28, left:left + 28] = 0
        assert np.abs(rest).max() < 1e-3  # and nothing else on the canvas


def test_an_image_folder_crops_wider_for_tokens_and_resizes_for_zoom(tmp_path):
    """An image folder trained at 32 px (its validation transform: short side 32 / 0.875, centre 32): tokens at 48
    keeps that resize and crops 48 (a larger field), zoom resizes for 48 and crops the trained 32."""
    from torchvision.transforms import v2

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in ("a", "b"):
            (tmp_path / split / label).mkdir(parents=True)
            Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(tmp_path / split / label / "0.png")
    options = {"name": "imagefolder", "root": str(tmp_path), "batch_size": 2, "img_size": 32}
    files = sorted((tmp_path / "val").rglob("*.png"))
    for view, resize, canvas in (("tokens", 32, 48), ("zoom", 48, 32), ("both", 48, 48)):
        got = first_batch(viewed_data(options, {"img_size": 48}, view, 32)).numpy()
        short = v2.Resize(round(resize / 0.875), antialias=True)  # the folder's own validation resize
        ref = np.stack([np.asarray(short(Image.open(f).convert("RGB"))).transpose(2, 0, 1) for f in files])
        np.testing.assert_allclose(got, naive_centre(ref.astype(np.float32), canvas), atol=1e-3)


@pytest.mark.parametrize("changes, message", [
    ({}, "--view zoom: give the target side with --data.img_size=N, other than the 28 px"),
    ({"img_size": 28}, "other than the 28 px the run trained at"),
    ({"img_size": 56, "resize": "pad"}, "--view zoom decides how the images meet 56 px: leave --data.resize"),
])
def test_a_view_without_a_target_or_with_a_resize_is_one_line(changes, message):
    with pytest.raises(ValueError, match=message):
        viewed_data({"name": "mnist5k"}, changes, "zoom", 28)


def test_each_view_has_its_own_key_and_the_keys_of_before_read_as_their_views():
    keys = {view: str(EvalKey("translated_mnist", 56, view)) for view in ("tokens", "zoom", "both")}
    assert keys == {"tokens": "translated_mnist@56px/tokens", "zoom": "translated_mnist@56px/zoom-only",
                    "both": "translated_mnist@56px/both"}
    assert all(parse(key).view == view for view, key in keys.items())
    assert parse("mnist5k@56px/zoom").view == "both" and parse("mnist5k@56px/canvas").view == "tokens"
    assert parse("mnist5k@21px").view == "both"  # the earliest keys: a resize
    with pytest.raises(ValueError, match="unknown eval view 'canvas'"):
        EvalKey("mnist5k", 56, "canvas")


@pytest.mark.slow
def test_a_tiny_translated_mnist_run_is_evaluated_under_the_three_views_into_its_record_and_table(tmp_path):
    from tiny import TINY_MODEL

    from vit_lightning import cli

    fit = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
           "--run.wandb=off", "--run.fewshot_shots=[]", "--data.name=translated_mnist", "--model.patch_size=7",
           "--model.pos_encoding=none", f"--run.root={tmp_path}", "--run.trial=t"]
    assert cli.main(["fit", *fit]) == 0
    run = tmp_path / "adhoc" / "local" / "t"
    for view in ("tokens", "zoom", "both"):
        assert cli.main(["eval", str(run), "--data.img_size=56", "--view", view, "--shots", "--shuffle-perms", "0",
                         "--attention-images", "0", "--into-record"]) == 0
    record = json.loads((run / "results.json").read_text())
    assert set(record["eval"]) == {"translated_mnist@56px/tokens", "translated_mnist@56px/zoom-only",
                                   "translated_mnist@56px/both"}
    sides = {name: json.loads((run / f"eval-translated_mnist-56px{name}.json").read_text())["img_size"]
             for name in ("-tokens", "-zoom", "")}
    assert sides == {"-tokens": 56, "-zoom": 42, "": 56}  # the zoom keeps the trained canvas: 6 x 6 tokens
    assert all(0 <= m["val/acc"] <= 1 for m in record["eval"].values())
    assert re.fullmatch(r"[0-9a-f]{40}(\+changes)?", record["versions"]["commit"])  # the commit it trained at

    grids = ({ENC: ["none"]},)
    profile = Profile("demo", {"data.name": "translated_mnist", "trainer.max_epochs": 3}, grids, (0,))
    ab = Ablation("resolution", "t", "s", "f", "val/acc_best", ENC, None, {}, "", {"demo": profile})
    name = write_run(tmp_path / "runs", ab, {ENC: "none"}, 0, 0.5,
                     **{"model.img_size": 42, "data.name": "translated_mnist"})
    path = tmp_path / "runs" / "resolution" / "demo" / name / "results.json"
    canned = json.loads(path.read_text())
    path.write_text(json.dumps({**canned, "eval": record["eval"]}))
    _, md = table(ab, tmp_path)
    view = md.split("evaluated at other image sizes (columns, px) without fine-tuning")[1]
    assert md_cells(view, "cell") == ["cell", "42 px", "56 px (tokens)", "56 px (zoom)", "56 px (both)"]
    measured = [f"{record['eval'][f'translated_mnist@56px/{v}']['val/acc']:.4f} (n=1)" for v in ("tokens", "zoom-only",
                                                                                               "both")]
    assert md_cells(view, "none")[2:] == measured


def test_a_profile_declares_its_views_and_eval_declared_runs_each(tmp_path, capsys):
    """pos_encoding's modern profile declares 21 and 56 px in the three views (its demo, transfer's sources, 56 px):
    `eval RUN --declared` asks for six evaluations; a run whose profile declares none, or --declared with a size of
    its own, is one line."""
    import argparse

    from vit_lightning.ablation import load
    from vit_lightning.analysis.evaluate import declared, main

    three = ("tokens", "zoom", "both")
    assert load("pos_encoding").profile("modern").views == ((21, three), (56, three))
    assert load("pos_encoding").profile("demo").views == ((56, three),)
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"config": {"run.ablation": "pos_encoding", "run.profile": "modern"}}))
    args = argparse.Namespace(view=None)
    jobs = declared(str(run), args, ["--shots"])
    assert [(view, more[-1]) for view, more in jobs] == [
        (view, f"--data.img_size={side}") for side in (21, 56) for view in ("tokens", "zoom", "both")]
    assert all(more[0] == "--shots" for _, more in jobs)
    with pytest.raises(ValueError, match="leave --view and --data.img_size out"):
        declared(str(run), args, ["--data.img_size=56"])
    config = {"run.ablation": "pos_encoding", "run.profile": "relative_scale"}
    (run / "results.json").write_text(json.dumps({"config": config}))
    assert main([str(run), "--declared"]) == 2
    assert capsys.readouterr().err.strip() == ("vit-ablate eval: error: --declared: profile 'relative_scale' of "
                                               "pos_encoding "
                                               "declares no evaluations (its `views`)")
    with pytest.raises(ValueError, match="views are \\(target side, views\\) pairs"):
        Profile("p", {}, ({ENC: ["none"]},), (0,), views=((56, ("crop",)),))

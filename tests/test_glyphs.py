"""The position benchmarks: glyphs (rendered from seed and index) and translated_mnist, and data.resize=pad."""

import json

import numpy as np
import pytest
import torch

from vit_lightning.data.datamodule import ImageDataModule
from vit_lightning.data.glyphs import GAP, KINDS, RELATIONS, SIZES, TASKS, Placed, render, render_set, stamp
from vit_lightning.data.sources import read_mnist5k


def centre(glyph) -> tuple[float, float]:
    _, k, top, left = glyph
    return top + (k - 1) / 2, left + (k - 1) / 2


def quadrant(glyph, size: int) -> int:
    """The quadrant (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right) the glyph's box lies wholly in, or -1."""
    _, k, top, left = glyph
    half = size / 2
    rows = {r for r in (top >= half, top + k - 1 >= half)}
    cols = {c for c in (left >= half, left + k - 1 >= half)}
    return 2 * rows.pop() + cols.pop() if len(rows) == len(cols) == 1 else -1


def relation(a, b) -> str:
    """Where b lies from a, by the larger axis of the offset between their centres."""
    dy, dx = np.subtract(centre(b), centre(a))
    return ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else ("below" if dy > 0 else "above")


@pytest.mark.parametrize("task", TASKS)
def test_an_image_is_a_function_of_seed_and_index_alone(task):
    torch.manual_seed(1)
    np.random.seed(1)
    first = render(3, 17, 36, task)
    torch.manual_seed(2)
    np.random.seed(2)
    again = render(3, 17, 36, task)
    assert np.array_equal(first[0], again[0]) and first[1:] == again[1:]
    assert not np.array_equal(first[0], render(3, 18, 36, task)[0])  # another index, another image
    assert not np.array_equal(first[0], render(4, 17, 36, task)[0])  # another seed too
    x, y = render_set(3, 20, 36, task)
    assert x.shape == (20, 1, 36, 36) and x.dtype == torch.uint8
    assert torch.equal(x[17, 0], torch.from_numpy(np.round(first[0] * 255).astype(np.uint8)))
    assert torch.equal(render_set(3, 20, 36, task)[0], x)


@pytest.mark.parametrize("size", [22, 36, 60])
def test_labels_agree_with_the_glyphs_placed(size):
    """Each label recomputed from the glyph placements: the solid glyph's quadrant, the checkered glyph's direction
    from the solid one, the kind of every glyph."""
    for index in range(200):
        _, label, glyphs = render(0, index, size, "absolute")
        solid = [g for g in glyphs if g[0] == "solid"]
        assert len(solid) == 1 and quadrant(solid[0], size) == label
        _, label, glyphs = render(0, index, size, "relative")
        solid, checker = ([g for g in glyphs if g[0] == kind] for kind in ("solid", "checker"))
        assert len(solid) == len(checker) == 1 and relation(solid[0], checker[0]) == RELATIONS[label]
        _, label, glyphs = render(0, index, size, "position_free")
        assert 2 <= len(glyphs) <= 3 and {g[0] for g in glyphs} == {KINDS[label]}
        for task in TASKS:
            for _, k, top, left in render(0, index, size, task)[2]:
                assert k in SIZES and 0 <= top <= size - k and 0 <= left <= size - k


@pytest.mark.parametrize("task", TASKS)
def test_the_glyphs_are_drawn_where_placed_and_the_last_ones_whole(task):
    image, _, glyphs = render(5, 9, 36, task)
    kind, k, top, left = glyphs[-1]  # drawn last: nothing covers it
    window = image[top:top + k, left:left + k]
    assert (window[stamp(kind, k)] >= 0.7).all()  # glyph pixels: 0.7 to 1
    assert (image < 1.0 + 1e-9).all() and (image >= 0).all()
    blank = np.ones_like(image, bool)
    for _, k, top, left in glyphs:
        blank[top:top + k, left:left + k] = False
    if task != "position_free":  # (its distractor strokes lie anywhere, outside the glyph boxes too)
        assert image[blank].max() < 0.25  # elsewhere only the pixel noise


def test_every_texture_shows_in_any_2x2_piece():
    pieces = {kind: {stamp(kind, 7)[y:y + 2, x:x + 2].tobytes() for y in range(6) for x in range(6)} for kind in KINDS}
    for a in KINDS:
        for b in KINDS:
            assert a == b or not pieces[a] & pieces[b]


@pytest.mark.parametrize("task", TASKS)
def test_each_task_has_four_classes_in_equal_numbers_in_both_splits(task):
    dm = ImageDataModule("glyphs", task=task, batch_size=8)
    dm.setup()
    assert dm.num_classes == 4 and dm.img_size == 36 and dm.in_chans == 1
    for split in (dm.train_set, dm.val_set):
        assert torch.bincount(split.labels).tolist() == [len(split.labels) // 4] * 4
    assert (len(dm.train_set), len(dm.val_set)) == (3200, 800)


def test_a_larger_canvas_draws_the_same_glyph_sizes_and_glyph_scale_enlarges_pixels():
    dm = ImageDataModule("glyphs", task="relative", img_size=60, batch_size=8)
    dm.setup()
    x, _ = next(iter(dm.val_dataloader()))
    assert x.shape == (8, 1, 60, 60) and dm.view == "canvas"
    small, _ = render_set(2, 3, 18, "absolute")
    big, _ = render_set(2, 3, 72, "absolute", scale=4)
    assert torch.equal(big, small.repeat_interleave(4, dim=2).repeat_interleave(4, dim=3))


def test_translated_digits_move_in_training_and_stay_put_in_validation():
    digits, labels = read_mnist5k()
    dm = ImageDataModule("translated_mnist", batch_size=4)
    dm.setup()
    assert dm.img_size == 42 and dm.view == "canvas"
    val = [dm.val_set[i][0] for i in range(3)]
    assert all(torch.equal(a, dm.val_set[i][0]) for i, a in enumerate(val))  # fixed offsets
    torch.manual_seed(0)
    first = dm.train_set[0][0]
    moved = any(not torch.equal(first, dm.train_set[0][0]) for _ in range(5))
    assert moved and first.shape == (1, 42, 42)
    digit = dm.train_set.images[0]
    found = [(t, le) for t in range(15) for le in range(15) if torch.equal(first[:, t:t + 28, le:le + 28], digit)]
    assert found and first.sum() == digit.sum()  # the digit whole, nothing else drawn
    view, view_labels = dm.unaugmented_train()  # fixed places: two reads of an image agree
    assert torch.equal(view[0][0], view[0][0]) and torch.equal(view_labels, dm.train_set.labels)
    assert isinstance(view, Placed) and view.offsets is not None


def test_pad_centres_the_image_on_a_larger_canvas_where_zoom_resizes_it():
    pad = ImageDataModule("mnist5k", img_size=42, resize="pad", batch_size=4)
    zoom = ImageDataModule("mnist5k", img_size=42, batch_size=4)
    for dm in (pad, zoom):
        dm.setup()
    (xp, _), (xz, _) = next(iter(pad.val_dataloader())), next(iter(zoom.val_dataloader()))
    native = ImageDataModule("mnist5k", batch_size=4)
    native.setup()
    x, _ = next(iter(native.val_dataloader()))
    assert torch.allclose(xp[:, :, 7:35, 7:35], x) and pad.view == "canvas" and zoom.view == "zoom"
    border = xp.clone()
    border[:, :, 7:35, 7:35] = border[0, 0, 0, 0]
    assert torch.all(border == border[0, 0, 0, 0])  # zero pixels, normalised
    assert not torch.allclose(xz[:, :, 7:35, 7:35], x)


@pytest.mark.parametrize("options, words", [
    ({"name": "glyphs"}, "give data.task, one of absolute, relative, position_free"),
    ({"name": "glyphs", "task": "count"}, "give data.task, one of absolute, relative, position_free"),
    ({"name": "mnist5k", "task": "absolute"}, "data.task is for glyphs"),
    ({"name": "mnist5k", "resize": "crop"}, "unknown data.resize 'crop'; valid: zoom, pad"),
    ({"name": "mnist5k", "resize": "pad", "img_size": 21}, "pad only enlarges"),
    ({"name": "glyphs", "task": "relative", "img_size": 21}, "at least 22 px"),
    ({"name": "glyphs", "task": "relative", "img_size": 36, "glyph_scale": 5}, "a multiple of it"),
    ({"name": "mnist5k", "glyph_scale": 2}, "only for glyphs"),
])
def test_bad_benchmark_options_are_one_line_errors(options, words):
    with pytest.raises(ValueError) as err:
        ImageDataModule(**options)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_glyphs_run_is_evaluated_on_larger_canvases_into_its_record(tmp_path, capsys):
    """fit at 24 px (4 x 4 tokens), then `vit-ablate eval RUN --data.img_size=N --into-record` for two canvases: the
    position encoding resampled to the larger grid, the glyphs drawn at their own size, filed under /tokens."""
    from tiny import TINY_MODEL

    from vit_lightning import cli
    from vit_lightning.commands.results.resolution import accuracy_by_size

    fit = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
           "--run.wandb=off", "--run.fewshot_shots=[]", "--data.name=glyphs", "--data.task=relative",
           "--data.img_size=24", "--model.patch_size=6", "--model.pos_encoding=learned_2d", f"--run.root={tmp_path}",
           "--run.trial=g"]
    assert cli.main(["fit", *fit]) == 0
    run = tmp_path / "adhoc" / "local" / "g"
    for size in (36, 48):
        assert cli.main(["eval", str(run), f"--data.img_size={size}", "--shots", "--shuffle-perms", "0",
                         "--into-record"]) == 0
    # another task, another glyph scale (a zoom of the content): filed apart, and not the run's resolution view
    for other in (["--data.task=absolute"], ["--data.glyph_scale=2"]):
        assert cli.main(["eval", str(run), "--data.img_size=48", *other, "--shots", "--shuffle-perms", "0",
                         "--into-record"]) == 0
    record = json.loads((run / "results.json").read_text())
    assert set(record["eval"]) == {"glyphs:relative:x1@36px/tokens", "glyphs:relative:x1@48px/tokens",
                                   "glyphs:absolute:x1@48px/tokens", "glyphs:relative:x2@48px/both"}
    found = accuracy_by_size(record)
    assert set(found) == {(24, ""), (36, "tokens"), (48, "tokens")} and all(0 <= v <= 1 for v in found.values())
    written = json.loads((run / "eval-glyphs-relative-x1-48px-tokens.json").read_text())
    assert written["view"] == "tokens" and written["img_size"] == 48 and written["data"]["task"] == "relative"
    assert written["source"]["pos_resize"]  # the encoding met the 8 x 8 grid as its rule says


def test_version_2_labels_agree_with_the_glyphs_placed_and_glyphs_stay_apart():
    """Version 2, labels recomputed from the placements: the solid glyph alone in its quadrant; the checkered glyph's
    side, at least GAP px from the solid one along its axis; one glyph of the class's kind."""
    for size in (22, 36, 60):
        for index in range(200):
            (_, label, absolute), (_, rlabel, pair), (_, flabel, free) = (render(1, index, size, task, 2)
                                                                       for task in TASKS)
            assert len(absolute) == 1 and absolute[0][0] == "solid" and quadrant(absolute[0], size) == label
            solid, checker = pair
            assert (solid[0], checker[0]) == ("solid", "checker") and relation(solid, checker) == RELATIONS[rlabel]
            apart = max(abs(solid[2] - checker[2]), abs(solid[3] - checker[3])) - solid[1]
            assert apart >= GAP
            assert len(free) == 1 and free[0][0] == KINDS[flabel]
            for _, k, top, left in absolute + pair + free:
                assert k in SIZES and 0 <= top <= size - k and 0 <= left <= size - k


def fresh_module(**options) -> ImageDataModule:
    dm = ImageDataModule("glyphs", task="absolute", glyph_version=2, batch_size=16, val_split=0.95, **options)
    dm.setup()
    return dm


def epoch_images(loader, e: int, batches: int | None = None) -> torch.Tensor:
    loader.sampler.set_epoch(e)
    got = [x for _, (x, _) in zip(range(batches or 10**6), loader)]
    return torch.cat(got)


def test_fresh_glyphs_draw_new_training_images_every_epoch_and_keep_validation_fixed():
    fixed, fresh = fresh_module(), fresh_module(fresh=True)
    assert len(fresh.train_set) == len(fixed.train_set) == 200 and torch.equal(fresh.val_set.images,
                                                                               fixed.val_set.images)
    loader = fresh.train_dataloader()
    first, second = epoch_images(loader, 0), epoch_images(loader, 1)
    assert first.shape == second.shape == (200, 1, 36, 36)
    assert torch.equal(first, epoch_images(loader, 0))  # an epoch's images: a function of (seed, epoch) alone
    rows = lambda x: {bytes(v.numpy().tobytes()) for v in x}  # noqa: E731
    held = rows(torch.cat([x for x, _ in fresh.val_dataloader()]))
    assert not rows(first) & rows(second) and not (rows(first) | rows(second)) & held  # all different images
    loader.sampler.set_epoch(1)
    assert sorted(loader.sampler) == list(range(200, 400))  # keys epoch * 200 + position
    labels = torch.cat([y for _, y in loader])
    assert torch.bincount(labels).tolist() == [50] * 4  # each epoch balanced
    assert fresh.distinct_train_images(600) == 600 and fixed.distinct_train_images(600) == 200
    view, view_labels = fresh.unaugmented_train()  # probes read epoch 0's images, held
    assert torch.equal(view.images[0], fresh.train_set[0][0]) and torch.equal(view_labels, fresh.train_set.labels)


def test_a_fresh_epoch_resumed_mid_way_trains_the_images_the_cut_one_had_left():
    dm = fresh_module(fresh=True)
    unbroken = epoch_images(dm.train_dataloader(), 2)
    cut = epoch_images(dm.train_dataloader(), 2, batches=5)
    again = dm.train_dataloader()
    again.load_state_dict({"epoch": 2, "batches": 5, "finished": False})
    rest = torch.cat([x for x, _ in again])  # Lightning sets the same epoch before iterating: nothing to reset
    assert torch.equal(torch.cat([cut, rest]), unbroken)


@pytest.mark.parametrize("options, words", [
    ({"glyph_version": 3}, "unknown data.glyph_version 3; valid: 1, 2"),
    ({"fresh": True, "holdout": 0.1}, "give one of them"),
])
def test_bad_glyph_version_or_fresh_options_are_one_line_errors(options, words):
    with pytest.raises(ValueError) as err:
        ImageDataModule("glyphs", task="absolute", **options)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("options, words", [
    ({"name": "mnist5k", "fresh": True}, "data.fresh=true: mnist5k has a fixed training set"),
    ({"name": "mnist5k", "glyph_version": 2}, "only for glyphs"),
])
def test_fresh_and_glyph_version_belong_to_the_glyphs(options, words):
    with pytest.raises(ValueError) as err:
        ImageDataModule(**options)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("version", [1, 2])
def test_the_drawn_sets_are_each_image_rendered_and_enlarged_pixel_by_pixel(version):
    for task in TASKS:
        for size, scale in ((36, 1), (48, 2)):
            x, y = render_set(4, 12, size, task, scale, version, start=30)
            for i in range(12):  # the reference: render's floats, each pixel repeated scale x scale, then to uint8
                image, label, _ = render(4, 30 + i, size // scale, task, version)
                big = np.repeat(np.repeat(image, scale, axis=0), scale, axis=1)
                assert np.array_equal(x[i, 0].numpy(), np.round(big * 255).astype(np.uint8)) and y[i] == label
    # a fresh module draws only its validation images: the same ones as the module that draws all 4,000 and splits
    fixed, fresh = (ImageDataModule("glyphs", task="relative", glyph_version=version, fresh=f) for f in (False, True))
    fixed.setup(), fresh.setup()
    assert torch.equal(fresh.val_set.images, fixed.val_set.images) and len(fresh.val_set.images) == 800

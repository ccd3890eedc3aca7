"""The extrapolation view of a grid table: canvas evaluations against the factor, with the attention read-outs, a
figure of each, and per cell whether a fall coincides with entropy drift."""

from __future__ import annotations

import json
import math

from test_results import make, table, write_run

from vit_lightning.commands.results.extrapolation import canvas_points, fall_with_drift, normalised_entropy

ENC = "model.pos_encoding"


def _canvas(acc: float, entropy: float, tokens: int) -> dict:
    return {"val/acc": acc, "attn/entropy": entropy, "attn/distance": 1.5, "attn/tokens": tokens}


def test_a_records_canvases_become_points_by_factor():
    record = {"config": {"data.name": "mnist5k", "model.img_size": 36}, "metrics": {"val/acc": 0.9},
              "eval": {"mnist5k@36px/canvas": _canvas(0.8, 2.0, 37), "mnist5k@168px/canvas": _canvas(0.3, 5.0, 785),
                       "mnist5k@168px/canvas/keep": _canvas(0.5, 5.0, 785), "mnist5k@72px": {"val/acc": 0.1}}}
    points = canvas_points(record)
    assert sorted(points) == [1.0, 168 / 36]  # a zoom and another grid rule are not this curve
    assert points[1.0] == {"acc": 0.9, "entropy": 2.0, "distance": 1.5, "tokens": 37}  # its own val/acc at 1
    assert points[168 / 36]["acc"] == 0.3
    kept = canvas_points(record, "/keep")  # the kept table's curve: the same start, its own larger canvas
    assert sorted(kept) == [1.0, 168 / 36] and kept[1.0]["acc"] == 0.9 and kept[168 / 36]["acc"] == 0.5
    assert canvas_points(record, "/rope-ntk") == {1.0: points[1.0]}  # no evaluation with that rule: no curve


def test_a_fall_is_told_apart_by_whether_entropy_drifted():
    assert normalised_entropy(math.log(785), 785) == 1.0
    assert fall_with_drift((0.9, 0.88), (0.5, 0.9)) == "holds"
    assert fall_with_drift((0.9, 0.5), (0.50, 0.52)) == "falls without entropy drift"
    assert fall_with_drift((0.9, 0.5), (0.50, 0.70)) == "falls with entropy drift"
    assert fall_with_drift((0.9, 0.5), (math.nan, math.nan)) == "falls"


def test_the_table_draws_the_curves_and_says_which_fall_drifted(tmp_path):
    ab = make("canvas", ENC, None, [{ENC: ["none", "learned_1d"]}], seeds=(0, 1), baseline={ENC: "none"})
    for seed in (0, 1):
        for encoding, far, entropy in [("none", 0.84, 2.0), ("learned_1d", 0.4, 5.5)]:
            name = write_run(tmp_path / "runs", ab, {ENC: encoding}, seed, 0.85, **{"model.img_size": 36,
                                                                                   "data.name": "mnist5k"})
            path = tmp_path / "runs/canvas/demo" / name / "results.json"
            record = json.loads(path.read_text())
            record["metrics"]["val/acc"] = 0.85
            record["eval"] = {"mnist5k@36px/canvas": _canvas(0.85, 2.0, 37),
                              "mnist5k@168px/canvas": _canvas(far + 0.01 * seed, entropy, 785)}
            if encoding == "learned_1d":  # its table kept, beside interpolated: a curve of its own
                record["eval"]["mnist5k@168px/canvas/keep"] = _canvas(0.8, 2.1, 785)
            path.write_text(json.dumps(record))
    out, md = table(ab, tmp_path)
    # learned_1d: 2.0 / log 37 = 0.55 of uniform at 1x, 5.5 / log 785 = 0.83 at 4.67x
    assert "trained -> 4.67x): " in md
    assert "falls with entropy drift: learned_1d (0.850 -> 0.405, entropy 0.55 -> 0.83 of uniform)" in md
    assert "holds: none (0.850 -> 0.845" in md
    assert "learned_1d (keep) (0.850 -> 0.800, entropy 0.55 -> 0.32 of uniform)" in md
    assert (out / "extrapolation.png").stat().st_size > 0 and (out / "attention_readouts.png").stat().st_size > 0


def test_the_absolute_tasks_canvas_columns_say_the_quadrants_scale(tmp_path):
    from test_results import md_cells

    task = "data.task"
    ab = make("canvas", ENC, None, [{ENC: ["none"], task: ["absolute"]}], seeds=(0,), baseline={ENC: "none"})
    name = write_run(tmp_path / "runs", ab, {ENC: "none", task: "absolute"}, 0, 0.85, **{"model.img_size": 36})
    path = tmp_path / "runs/canvas/demo" / name / "results.json"
    record = json.loads(path.read_text())
    record["eval"] = {"mnist5k@168px/canvas": {"val/acc": 0.5}}
    path.write_text(json.dumps(record))
    _, md = table(ab, tmp_path)
    view = md.split("evaluated at other image sizes (columns, px) without fine-tuning")[1]
    assert md_cells(view, "cell") == ["cell", "36 px", "168 px (tokens; quadrants scale with the canvas)"]


def test_a_fall_without_read_outs_is_said_once_for_the_panel(monkeypatch):
    from vit_lightning.commands.results import extrapolation

    curves = {(cell, ""): {1.0: {"acc": [0.9]}, 2.0: {"acc": [acc]}} for cell, acc in ((0, 0.4), (1, 0.3), (2, 0.88))}
    monkeypatch.setattr(extrapolation, "cell_curves", lambda data: curves)
    monkeypatch.setattr(extrapolation, "curve_name", lambda data, cell, rules, keys: f"c{cell}")
    data = type("D", (), {"profile": type("P", (), {"axes": ()})(), "ablation": type("A", (), {"panel": None})()})()
    line = extrapolation.drift_line(data)
    assert line.count("no attention read-outs") == 1 and "falls: c0 (0.900 -> 0.400), c1 (0.900 -> 0.300)" in line
    assert "holds: c2 (0.900 -> 0.880)" in line and "trained -> 2x" in line

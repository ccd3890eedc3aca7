"""The resolution view of a grid table: each run evaluated at other image sizes (eval --into-record), no fine-tuning."""

import json

from test_results import make, md_cells, table, write_run

from vit_lightning.analysis.evaluate import add_eval
from vit_lightning.commands.results.resolution import accuracy_by_size
from vit_lightning.core.evalkey import EvalKey

ENC = "model.pos_encoding"


def test_an_eval_filed_into_the_record_is_read_at_its_size_and_a_patch_size_eval_is_not():
    record = {"config": {"data.name": "mnist5k", "model.img_size": 28}, "metrics": {"val/acc": 0.9}}
    for size, acc, view, patch in [(21, 0.4, "both", None), (56, 0.3, "both", None), (28, 0.1, "native", 4),
                                   (42, 0.7, "tokens", None), (56, 0.5, "zoom", None)]:  # 42: the digit at its own scale on a larger canvas
        key = EvalKey("mnist5k", size, view, patch=patch)
        add_eval({"key": str(key), "metrics": {"val/acc": acc}})(record)  # what `eval RUN --into-record` does
    record["eval"]["cifar10@21px/zoom"] = {"val/acc": 0.0}  # another dataset: not this run's resolution view
    record["eval"] = {"mnist5k@42px/tokens/keep": {"val/acc": 0.2}, **record["eval"]}  # another grid rule, filed first
    assert set(record["eval"]) == {"mnist5k@21px/both", "mnist5k@56px/both", "mnist5k@28px/native/p4",
                                   "mnist5k@42px/tokens", "mnist5k@56px/zoom-only", "cifar10@21px/zoom",
                                   "mnist5k@42px/tokens/keep"}
    assert accuracy_by_size(record) == {(28, ""): 0.9, (21, "both"): 0.4, (56, "both"): 0.3, (42, "tokens"): 0.7,
                                        (56, "zoom"): 0.5}
    # the keys of before read as the views they were: no view word or `zoom` (a resize) both, `canvas` tokens
    record["eval"] = {"mnist5k@21px": {"val/acc": 0.4}, "mnist5k@56px/zoom": {"val/acc": 0.3},
                      "mnist5k@28px/p4": {"val/acc": 0.1}, "mnist5k@42px/canvas": {"val/acc": 0.7}}
    assert accuracy_by_size(record) == {(28, ""): 0.9, (21, "both"): 0.4, (56, "both"): 0.3, (42, "tokens"): 0.7}


def test_an_evaluation_on_another_task_or_glyph_scale_is_filed_apart_and_not_read_as_the_runs_own():
    config = {"data.name": "glyphs", "data.task": "absolute", "data.glyph_scale": 1, "model.img_size": 36}
    record = {"config": config, "metrics": {"val/acc": 0.9}}
    for task, scale, view, acc in [("absolute", 1, "tokens", 0.8), ("relative", 1, "tokens", 0.3),
                                   ("absolute", 2, "both", 0.2)]:
        add_eval({"key": str(EvalKey("glyphs", 48, view, task, scale)), "metrics": {"val/acc": acc}})(record)
    assert set(record["eval"]) == {"glyphs:absolute:x1@48px/tokens", "glyphs:relative:x1@48px/tokens",
                                   "glyphs:absolute:x2@48px/both"}
    assert accuracy_by_size(record) == {(36, ""): 0.9, (48, "tokens"): 0.8}  # the run's own task and scale only
    record["eval"] = {"glyphs@48px/canvas": {"val/acc": 0.8}}  # a key of before: the run's own task, as eval defaulted
    assert accuracy_by_size(record) == {(36, ""): 0.9, (48, "tokens"): 0.8}


def test_each_view_is_a_column_of_its_own_named_by_it(tmp_path):
    ab = make("resolution", ENC, None, [{ENC: ["none"]}], seeds=(0,), baseline={ENC: "none"})
    name = write_run(tmp_path / "runs", ab, {ENC: "none"}, 0, 0.85, **{"model.img_size": 28})
    path = tmp_path / "runs/resolution/demo" / name / "results.json"
    record = json.loads(path.read_text())
    record["eval"] = {"mnist5k@56px": {"val/acc": 0.2}, "mnist5k@56px/canvas": {"val/acc": 0.8},
                      "mnist5k@56px/zoom-only": {"val/acc": 0.5}}
    path.write_text(json.dumps(record))
    _, md = table(ab, tmp_path)
    view = md.split("evaluated at other image sizes (columns, px) without fine-tuning")[1]
    assert ("each column named by its view (tokens: on a canvas of that side, the content at its own scale; zoom: the "
            "content scaled by that side over the trained one, on the trained canvas, the same tokens; both: resized "
            "to that side") in view
    assert md_cells(view, "cell") == ["cell", "28 px", "56 px (tokens)", "56 px (zoom)", "56 px (both)"]
    assert md_cells(view, "none")[2:] == ["0.8000 (n=1)", "0.5000 (n=1)", "0.2000 (n=1)"]


def test_the_grid_table_shows_each_cell_at_every_evaluated_size(tmp_path):
    ab = make("resolution", ENC, None, [{ENC: ["none", "learned_1d"]}], seeds=(0, 1), baseline={ENC: "none"})
    _, md = table(ab, tmp_path)
    assert "evaluated at other image sizes" not in md  # no evaluations: no view
    for seed in (0, 1):
        for encoding, own, small, large in [("none", 0.85, 0.6, 0.2), ("learned_1d", 0.9, 0.5 + 0.1 * seed, 0.3)]:
            name = write_run(tmp_path / "runs", ab, {ENC: encoding}, seed, own, **{"model.img_size": 28})
            path = tmp_path / "runs/resolution/demo" / name / "results.json"
            record = json.loads(path.read_text())
            record["metrics"]["val/acc"] = own
            record["eval"] = {"mnist5k@21px": {"val/acc": small}, "mnist5k@56px": {"val/acc": large}}
            if encoding == "none" and seed == 1:
                del record["eval"]["mnist5k@56px"]  # a run not evaluated there: that cell's n says so
            path.write_text(json.dumps(record))
    _, md = table(ab, tmp_path)
    assert "Each cell evaluated at other image sizes (columns, px) without fine-tuning" in md  # its caption
    view = md.split("evaluated at other image sizes (columns, px) without fine-tuning")[1]
    assert md_cells(view, "cell") == ["cell", "21 px (both)", "28 px", "56 px (both)"]  # keys of before: resized
    assert md_cells(view, "none") == ["none", "0.6000 ± 0.0000 (n=2)", "**0.8500 ± 0.0000 (n=2)**", "0.2000 (n=1)"]
    assert md_cells(view, "learned_1d") == ["learned_1d", "0.5500 ± 0.0707 (n=2)", "**0.9000 ± 0.0000 (n=2)**",
                                            "0.3000 ± 0.0000 (n=2)"]


def test_a_table_made_before_an_eval_into_the_record_takes_it_up_when_made_again(tmp_path):
    from vit_lightning.run.rundir import update_record

    ab = make("resolution", ENC, None, [{ENC: ["none"]}], seeds=(0,), baseline={ENC: "none"})
    name = write_run(tmp_path / "runs", ab, {ENC: "none"}, 0, 0.85, **{"model.img_size": 28})
    out, md = table(ab, tmp_path)
    assert "evaluated at other image sizes" not in md and "eval" not in json.loads((out / "records" / f"{name}.json")
                                                                                   .read_text())
    update_record(tmp_path / "runs/resolution/demo" / name,
                  lambda record: record.setdefault("eval", {}).update({"mnist5k@21px": {"val/acc": 0.5}}))
    out, md = table(ab, tmp_path)  # the record's copy is replaced: the evaluation is in it, and in the view
    assert json.loads((out / "records" / f"{name}.json").read_text())["eval"] == {"mnist5k@21px": {"val/acc": 0.5}}
    assert md_cells(md.split("evaluated at other image sizes (columns, px)")[1], "none")[1] == "0.5000 (n=1)"


DAMAGE = {  # (encoding, seed) -> what is wrong in that run's record, and the key the warning names
    ("none", 0): (lambda r: r["eval"].update({"mnist5k@56px": [0.3]}), "eval['mnist5k@56px']: a list"),
    ("none", 1): (lambda r: r["eval"].update({"mnist5k@21px": "0.6"}), "eval['mnist5k@21px']: '0.6' is not a number"),
    ("learned_1d", 0): (lambda r: r["eval"]["mnist5k@21px"].update({"val/acc": "high"}),
                        "eval['mnist5k@21px']['val/acc']: 'high' is not a number"),
    ("learned_1d", 1): (lambda r: r["config"].update({"model.img_size": "28px"}),
                        "config['model.img_size']: '28px' is not an image size"),
    ("learned_1d", 2): (lambda r: r["eval"]["mnist5k@56px"].update({"val/acc": float("nan")}),
                        "eval['mnist5k@56px']['val/acc']: nan is not a finite number"),
    ("none", 2): (lambda r: r["metrics"].update({"val/acc_best": "0.85"}),
                  "metrics['val/acc_best']: '0.85' is not a number"),
}


def test_malformed_and_non_finite_entries_are_skipped_one_line_each_and_listed(tmp_path, capsys):
    """One validating loader for every record: never a traceback, never a nan cell, never averaged in silence; each
    bad entry named by file and key, and its run listed under "Runs not averaged" with why, in no cell at all."""
    ab = make("resolution", ENC, None, [{ENC: ["none", "learned_1d"]}], seeds=(0, 1, 2, 3), baseline={ENC: "none"})
    paths = {}
    for (encoding, seed), (damage, _) in {**DAMAGE, ("none", 3): (None, ""), ("learned_1d", 3): (None, "")}.items():
        name = write_run(tmp_path / "runs", ab, {ENC: encoding}, seed, 0.9 if damage else 0.75,
                         **{"model.img_size": 28})
        paths[encoding, seed] = path = tmp_path / "runs/resolution/demo" / name / "results.json"
        record = json.loads(path.read_text())
        record["metrics"]["val/acc"] = 0.8 if damage else 0.7
        record["eval"] = {"mnist5k@21px": {"val/acc": 0.5 if damage else 0.4}, "mnist5k@56px": {"val/acc": 0.25}}
        if damage:
            damage(record)
        path.write_text(json.dumps(record))
    capsys.readouterr()
    _, md = table(ab, tmp_path)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "nan" not in md.replace("nan is not a finite number", "")
    for (encoding, seed), (_, key) in DAMAGE.items():
        [line] = [line for line in err.splitlines() if key in line]
        assert f"{paths[encoding, seed].parent.name}.json: {key}" in line and "not averaged" in line
    view = md.split("evaluated at other image sizes (columns, px) without fine-tuning")[1]
    # only the undamaged seed 3 of each cell is averaged, in every column (its own numbers: 0.4, 0.7, 0.25)
    for encoding in ("none", "learned_1d"):
        assert md_cells(view, encoding)[1:] in (["0.4000 (n=1)", "0.7000 (n=1)", "0.2500 (n=1)"],
                                                ["0.4000 (n=1)", "**0.7000 (n=1)**", "0.2500 (n=1)"])
    excluded = md.split("Runs not averaged")[1]
    none2 = md_cells(excluded, paths["none", 2].parent.name)
    assert "no metric (metrics['val/acc_best']: '0.85' is not a number)" in none2
    for (encoding, seed), (_, key) in DAMAGE.items():
        if (encoding, seed) != ("none", 2):
            assert any(f"unreadable: {key}" in cell for cell in md_cells(excluded, paths[encoding, seed].parent.name))


def test_a_record_of_an_unknown_schema_is_listed_not_averaged(tmp_path, capsys):
    """A record written in another schema may mean other things by the same keys: listed with why, not averaged."""
    ab = make("resolution", ENC, None, [{ENC: ["none"]}], seeds=(0, 1), baseline={ENC: "none"})
    names = [write_run(tmp_path / "runs", ab, {ENC: "none"}, seed, acc) for seed, acc in ((0, 0.6), (1, 0.9))]
    path = tmp_path / "runs/resolution/demo" / names[1] / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema": 2}))
    _, md = table(ab, tmp_path)
    assert md_cells(md.split("- **Source")[1], "none")[1] == "**0.6000 (n=1)**"  # seed 1's 0.9 is not averaged in
    why = md_cells(md.split("Runs not averaged")[1], names[1])
    assert any("unreadable: schema: 2 is not the record schema this version reads (1)" in c for c in why)

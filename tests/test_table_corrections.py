"""What the position tables say beside their numbers: a selection at the edge of its grid is censored, an ignored
encoding carries its token grid and the bias it could give there, PEG its shuffle caveat, the drop its weights, and
a declared pair its own Welch test; patch_size's transfer view its same-grid control rows."""

from __future__ import annotations

import dataclasses
import json
import math

import torch
from scipy import stats
from test_results import CLS, ENC, INJ, LR, lr_runs, make, md_cells, table, write_run

from vit_lightning import ablation as ablations
from vit_lightning.ablation import Ablation, Profile
from vit_lightning.model.position import LARGEST_BIAS, Alibi2d, Peg, shuffle_caveat
from vit_lightning.records.stats import fmt_p, holm

SRC, PATCH = "model.init_from", "model.patch_size"


def _edit(root, ab, name, profile="demo", **changes) -> None:
    """Update a written record's sections (metrics, compute, config, eval) with `changes`."""
    path = root / ab.name / profile / name / "results.json"
    record = json.loads(path.read_text())
    for section, values in changes.items():
        record.setdefault(section, {}).update(values)
    path.write_text(json.dumps(record))


def test_a_selection_at_the_edge_of_the_values_tried_is_censored(tmp_path):
    """none's held-out curve peaks inside the three lrs tried, learned_1d's still rises at the largest: censored, and
    the stage's grid values no record tried are named."""
    grids = ({ENC: ["none"], INJ: ["stem"], SRC: ["a"]}, {ENC: ["learned_1d"], INJ: ["stem"], SRC: ["c"]})
    fixed = {"data.name": "mnist5k", "trainer.max_epochs": 3}
    candidates = [0.01, 0.03, 0.06, 0.1]
    profiles = {"demo": Profile("demo", {**fixed, LR: "select:demo_select"}, grids, (0,)),
                "demo_select": Profile("demo_select", fixed, tuple({**g, LR: candidates} for g in grids), (0,))}
    ab = Ablation("transfer", "t", "s", "f", "val/acc_best", ENC, INJ, {}, "", profiles, replicates=SRC)
    runs = tmp_path / "runs"
    curves = {"none": {0.01: 0.5, 0.03: 0.7, 0.06: 0.6}, "learned_1d": {0.01: 0.5, 0.03: 0.6, 0.06: 0.8}}
    for enc, source in (("none", "a"), ("learned_1d", "c")):
        chosen = max(curves[enc], key=curves[enc].get)
        write_run(runs, ab, {ENC: enc, INJ: "stem", SRC: source}, 0, 0.8, **{LR: chosen})
        for lr, acc in curves[enc].items():  # 0.1 is in the grid but never ran
            write_run(runs, ab, {ENC: enc, INJ: "stem", SRC: source, LR: lr}, 0, acc, profile="demo_select")
    _, md = table(ab, tmp_path)
    assert "none/stem 0.03 (0.01: 0.500, 0.03: 0.700, 0.06: 0.600), interior; " in md
    assert "learned_1d/stem 0.06 (0.01: 0.500, 0.03: 0.600, 0.06: 0.800), censored (the largest tried)" in md
    assert "censored in 1 of 2 cells: the held-out accuracy still rises at the edge of the values tried" in md
    assert "demo_select also lists 0.1, not run here" in md


def _pos_ablation(encodings, **fields) -> Ablation:
    grids = [{ENC: list(encodings), INJ: ["stem"]}]
    return dataclasses.replace(make("pos_encoding", ENC, INJ, grids, baseline={ENC: "none"}),
                               columns=ablations.SHUFFLE_COLUMN, **fields)


def test_an_ignored_encoding_carries_its_grid_and_largest_bias_and_peg_its_caveat(tmp_path):
    """alibi_2d's drop equals none's: ignored at the 4x4 grid of its 28 px images in 7 px patches, with the largest
    bias per head its records store; PEG's drop gets what else a shuffle changes for it, as its padding says."""
    ab = _pos_ablation(["none", "alibi_2d", "peg"])
    drops = {"none": [0.0, 0.001, -0.001], "alibi_2d": [0.001, 0.0, -0.001], "peg": [0.5, 0.52, 0.51]}
    accs = {"none": [0.80, 0.81, 0.82], "alibi_2d": [0.80, 0.82, 0.81], "peg": [0.90, 0.91, 0.92]}
    bias = [1.0607, 0.2652, 0.0663, 0.0166]
    for enc in drops:
        for seed in range(3):
            name = write_run(tmp_path / "runs", ab, {ENC: enc, INJ: "stem"}, seed, accs[enc][seed],
                             **{"model.img_size": 28, "model.patch_size": 7})
            _edit(tmp_path / "runs", ab, name, metrics={"val/shuffle_drop": drops[enc][seed]},
                  compute={LARGEST_BIAS: bias} if enc == "alibi_2d" and seed else {})  # seed 0 predates the fact
    _, md = table(ab, tmp_path)
    assert ("ignored at a 4x4 grid: alibi_2d/stem (+0.0000; largest bias per head 1.06, 0.27, 0.07, 0.02 logits)"
            in md)
    assert ("'ignored at an NxN grid': a distance bias that spans few logits at that grid, the drop within seed noise "
            "of the baseline's and the accuracy not above it") in md  # said once, on the Tests line
    grid = md[md.index("## Verdicts"):md.index("- **Source")]
    assert md_cells(grid, "alibi_2d/stem")[-1] == "ignored at a 4x4 grid" and md_cells(grid, "peg/stem")[-1] == (
        "used, helps")
    assert f"what else a shuffle changes: peg/stem: {shuffle_caveat({'pos_encoding': 'peg'})}" in md
    assert "so the drop mixes position (the zero border) with neighbourhood content" in md


def test_alibi_records_each_heads_largest_bias_from_its_slopes_and_grid():
    """The steepest head's slope 2^-2 times the 4x4 grid's longest distance, sqrt(3^2 + 3^2); the others 2^-8i/4."""
    facts = Alibi2d(64, 4, (4, 4), 1).facts()[LARGEST_BIAS]
    assert facts == [round(2 ** (-8 * i / 4) * math.sqrt(18), 4) for i in range(1, 5)]
    assert Alibi2d(64, 4, (8, 8), 1).facts()[LARGEST_BIAS][0] == round(0.25 * math.sqrt(98), 4)


def test_a_circular_peg_has_no_border_so_it_commutes_with_rolling_the_grid():
    """Circular padding: rolling the token grid (a torus shift) rolls the output the same way, so no token can tell
    where it is; zero padding: the border breaks it. The padding is no parameter: the same state dict loads in both."""
    torch.manual_seed(0)
    zeros, circular = Peg(8, 2, (4, 4), 1), Peg(8, 2, (4, 4), 1, peg_padding="circular")
    circular.load_state_dict(zeros.state_dict())
    x = torch.randn(2, 1 + 16, 8)  # (B, [class] + 4x4 patches, D)

    def roll(t):  # the patch tokens rolled by (1, 2) on their grid, the [class] token kept
        return torch.cat([t[:, :1], t[:, 1:].unflatten(1, (4, 4)).roll((1, 2), (1, 2)).flatten(1, 2)], 1)

    assert torch.allclose(circular(roll(x)), roll(circular(x)), atol=1e-6)
    assert not torch.allclose(zeros(roll(x)), roll(zeros(x)), atol=1e-3)
    assert "with circular padding the grid has no border" in shuffle_caveat({"pos_encoding": "peg",
                                                                             "peg_padding": "circular"})


def test_the_drop_says_its_weights_are_the_final_ones_and_how_far_the_best_epoch_is(tmp_path):
    """Two runs whose best epoch is the last, one whose best lies 0.004 above its final weights."""
    ab = _pos_ablation(["none", "learned_1d"], baseline={ENC: "none"})
    for enc, seed, best, final in (("none", 0, 0.8, 0.8), ("none", 1, 0.81, 0.806), ("learned_1d", 0, 0.9, 0.9),
                                   ("learned_1d", 1, 0.91, 0.91)):
        name = write_run(tmp_path / "runs", ab, {ENC: enc, INJ: "stem"}, seed, best)
        _edit(tmp_path / "runs", ab, name, metrics={"val/acc": final, "val/shuffle_drop": 0.1 if enc != "none" else 0})
    _, md = table(ab, tmp_path)
    assert ("both top-1s of the final weights; the accuracy column is the best epoch's (val/acc_best), the final "
            "epoch in 3 of 4 runs, elsewhere at most 0.0040 above the final weights' (val/acc)") in md
    assert f"**Columns:** 'shuffle drop': {ablations.SHUFFLE_NOTE['shuffle drop']}" not in md  # not declared here
    declared = dataclasses.replace(ab, column_notes=ablations.SHUFFLE_NOTE)
    _, md = table(declared, tmp_path)
    assert f"**Columns:** 'shuffle drop': {ablations.SHUFFLE_NOTE['shuffle drop']}" in md


def test_a_declared_pair_is_tested_directly_beside_the_tests_against_the_baseline(tmp_path):
    """Swin's shift: relative bias shifted against unshifted, one Welch test (scipy, computed apart), Holm over one."""
    shift = "model.shift"
    grids = [{ENC: ["relative_bias_2d"], shift: [False, True]}, {ENC: ["none"], shift: [True]}]
    ab = dataclasses.replace(make("swin", ENC, shift, grids, seeds=range(4), baseline={ENC: "none"}),
                             columns=ablations.SHUFFLE_COLUMN,
                             pairs={"the shift": ({ENC: "relative_bias_2d", shift: True},
                                                  {ENC: "relative_bias_2d", shift: False})})
    accs = {True: [0.94, 0.95, 0.93, 0.945], False: [0.92, 0.915, 0.925, 0.93]}
    drops = {True: [0.70, 0.72, 0.71, 0.75], False: [0.74, 0.73, 0.78, 0.76]}
    for on, values in accs.items():
        for seed, acc in enumerate(values):
            name = write_run(tmp_path / "runs", ab, {ENC: "relative_bias_2d", shift: on}, seed, acc)
            _edit(tmp_path / "runs", ab, name, metrics={"val/shuffle_drop": drops[on][seed]})
    for seed, acc in enumerate((0.93, 0.931, 0.929, 0.932)):
        name = write_run(tmp_path / "runs", ab, {ENC: "none", shift: True}, seed, acc)
        _edit(tmp_path / "runs", ab, name, metrics={"val/shuffle_drop": 0.7 + 0.01 * (seed % 2)})
    _, md = table(ab, tmp_path)
    p = stats.ttest_ind(accs[True], accs[False], equal_var=False).pvalue
    diff = sum(accs[True]) / 4 - sum(accs[False]) / 4
    row = md_cells(md, "the shift")
    assert row[1] == "relative_bias_2d/shift=True" and row[3] == "relative_bias_2d/shift=False"
    drop_p = stats.ttest_ind(drops[True], drops[False], equal_var=False).pvalue
    drop_diff = sum(drops[True]) / 4 - sum(drops[False]) / 4
    assert row[5:] == [f"{diff:+.4f}", fmt_p(p), f"{fmt_p(holm([p])[0])} (higher)", f"{drop_diff:+.4f}", fmt_p(drop_p)]
    assert (f"direct pairs: the shift: relative_bias_2d/shift=True against relative_bias_2d/shift=False {diff:+.4f} "
            f"(Welch p={fmt_p(p)}, Holm p={fmt_p(p)}), higher by more than seed noise, shuffle drop {drop_diff:+.4f} "
            f"(Welch p={fmt_p(drop_p)})") in md
    _, md = table(dataclasses.replace(ab, pairs={}), tmp_path)
    assert "Direct pairs" not in md and "direct pairs" not in md


def _patch_runs(root, ab, controls: bool) -> None:
    """Patch sizes 4, 7 and 14 at 28 px, two seeds; patch 7's runs evaluated at 4 and 14 (at 28 px, and with the
    grid kept if `controls`)."""
    evals = {"mnist5k@28px/p4": 0.3, "mnist5k@28px/p14": 0.2}
    evals |= {"mnist5k@16px/p4": 0.8, "mnist5k@56px/p14": 0.7} if controls else {}
    for seed in (0, 1):
        for size in (4, 7, 14):
            name = write_run(root, ab, {PATCH: size}, seed, 0.9, **{"model.img_size": 28})
            mine = {k: {"val/acc": v + 0.01 * seed} for k, v in evals.items()} if size == 7 else {}
            _edit(root, ab, name, metrics={"val/acc": 0.85}, eval=mine)


def test_the_patch_transfer_view_has_same_grid_control_rows(tmp_path):
    """Patch 7 at 28 px is a 4x4 grid: its control at patch 4 is the eval at 16 px, at patch 14 the one at 56 px; the
    plain row reads the evals at 28 px. Without a control eval the caption says how to make one."""
    ab = make("patch_size", PATCH, None, [{PATCH: [4, 7, 14]}], seeds=(0, 1), layout="compute")
    _patch_runs(tmp_path / "runs", ab, controls=True)
    _, md = table(ab, tmp_path)
    view = md.split("evaluated at every patch size (columns) without fine-tuning")[1]
    assert md_cells(view, "7")[1:] == ["0.3050 ± 0.0071 (n=2)", "**0.8500 ± 0.0000 (n=2)**", "0.2050 ± 0.0071 (n=2)"]
    assert md_cells(view, "7, grid kept")[1:] == ["0.8050 ± 0.0071 (n=2)", "**0.8500 ± 0.0000 (n=2)**",
                                                  "0.7050 ± 0.0071 (n=2)"]
    assert md_cells(view, "4, grid kept")[1:] == ["**0.8500 ± 0.0000 (n=2)**", "missing", "missing"]
    assert "none evaluated yet" not in md
    plain = tmp_path / "plain"
    _patch_runs(plain / "runs", ab, controls=False)
    _, md = table(ab, plain)
    assert "(none evaluated yet: vit-ablate eval RUN --model.patch_size=P --data.img_size=S" in md
    view = md.split("evaluated at every patch size (columns) without fine-tuning")[1]
    assert "| 7, grid kept" not in view and md_cells(view, "7")[1] == "0.3050 ± 0.0071 (n=2)"


def test_the_lr_sweep_says_whether_its_optima_exclude_the_shift_the_paper_shows(tmp_path):
    """Optima at 2e-3 (CLS) and 5e-4 (GAP): their ratio's interval lies about 0.25, so it excludes the 0.375 of the
    lrs Figure 9 shows and does not exclude a shown ratio of 0.25."""
    heads = {"cls": "mlp_tanh", "gap": "linear"}
    lr_runs(tmp_path / "runs", CLS, {"cls": 0.002, "gap": 0.0005}, heads)
    shown = dataclasses.replace(CLS, shown_lrs=("Figure 9", {"gap/linear": 0.0003, "cls/mlp_tanh": 0.0008}))
    _, md = table(shown, tmp_path)
    interval = md.split("the interval of the optima's ratio gap/linear / cls/mlp_tanh (")[1].split(")")[0]
    low, high = (float(x) for x in interval.split(" to "))
    assert low < 0.25 < high < 0.375
    assert (f"({interval}) excludes a shift as large as the learning rates Figure 9 shows (0.0003 vs 0.0008; "
            "two lrs it plots, not optima it located)") in md
    sentence = md.split("the interval of the optima's ratio")[1].split("located)")[0]
    assert "0.375" not in sentence  # the ratio of two plotted lrs is no optimum's ratio to exclude
    _, md = table(dataclasses.replace(CLS, shown_lrs=("Figure 9", {"gap/linear": 0.0005, "cls/mlp_tanh": 0.002})),
                  tmp_path)
    assert f"({interval}) does not exclude a shift as large as the learning rates Figure 9 shows" in md
    _, md = table(CLS, tmp_path)
    assert "a shift as large" not in md

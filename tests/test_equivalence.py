"""Equivalence (TOST) and the per-panel grid table: a verdict that two cells perform alike, each question tested alone."""

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats
from test_results import make, md_cells, table, write_run

from vit_lightning.records.stats import ALPHA, compare, holm, tost_p

ENC, TASK = "model.pos_encoding", "data.task"


def naive_tost(a, b, margin):
    """TOST by hand: Welch's standard error and Satterthwaite's degrees of freedom, two one-sided t tails."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    d = a.mean() - b.mean()
    return max(stats.t.sf((d + margin) / se, df), stats.t.cdf((d - margin) / se, df))


@pytest.mark.parametrize("shift", [0.0, 0.005, 0.015, -0.03])
def test_tost_matches_the_formula(shift):
    rng = np.random.default_rng(0)
    a, b = 0.9 + shift + 0.004 * rng.standard_normal(5), 0.9 + 0.006 * rng.standard_normal(6)
    assert tost_p(a, b, 0.02) == pytest.approx(naive_tost(a, b, 0.02), rel=1e-9)


def test_equivalence_is_shown_inside_the_margin_and_not_outside_or_with_noise():
    rng = np.random.default_rng(1)
    ref = 0.9 + 0.002 * rng.standard_normal(5)
    close, far = ref + 0.001, ref + 0.03
    noisy = 0.9 + 0.05 * rng.standard_normal(5)
    comps = compare([close, far, noisy, [0.9]], ref, margin=0.02)
    assert [c.equivalent for c in comps] == [True, False, False, False]
    assert comps[3].equiv is None  # one run: no test
    raw = [tost_p(v, ref, 0.02) for v in (close, far, noisy)]
    assert [c.equiv for c in comps[:3]] == holm(raw)  # one Holm family of its own
    assert all(c.equiv is None for c in compare([close], ref))  # no margin: no equivalence test
    assert tost_p([0.9, 0.9], [0.9, 0.9], 0.01) == 0.0 and tost_p([0.9, 0.9], [0.95, 0.95], 0.01) == 1.0


def test_a_panel_table_tests_each_task_against_its_own_baseline_and_says_what_is_equivalent(tmp_path):
    ab = make("tasks", ENC, TASK, [{ENC: ["none", "learned_1d", "rope_axial"], TASK: ["absolute", "position_free"]}],
              seeds=(0, 1, 2, 3, 4))
    ab = dataclasses.replace(ab, baseline={ENC: "none"}, panel=TASK, equivalence_margin=0.02,
                             expected={"absolute": "none at chance, every encoding far above"})
    accuracy = {("none", "absolute"): 0.25, ("learned_1d", "absolute"): 0.8, ("rope_axial", "absolute"): 0.9,
                ("none", "position_free"): 0.95, ("learned_1d", "position_free"): 0.951,
                ("rope_axial", "position_free"): 0.90}
    for (enc, task), acc in accuracy.items():
        for seed in range(5):
            write_run(tmp_path / "runs", ab, {ENC: enc, TASK: task}, seed, acc + 0.001 * (seed - 2))
    _, md = table(ab, tmp_path)
    assert "Ours beside the paper (bold: the best of each task)" in md
    verdicts, grid = md[md.index("## Verdicts"):md.index("- **Source")], md.split("## Ours beside the paper")[1]
    assert md_cells(grid, "none")[1:] == ["0.2500 ± 0.0016 (n=5)", "0.9500 ± 0.0016 (n=5)"]
    assert md_cells(grid, "learned_1d")[1:] == ["0.8000 ± 0.0016 (n=5)", "**0.9510 ± 0.0016 (n=5)**"]
    assert md_cells(grid, "rope_axial")[1:] == ["**0.9000 ± 0.0016 (n=5)**", "0.9000 ± 0.0016 (n=5)"]
    # the verdict grid: each task a question; equivalence near the ceiling (0.95 is not within 0.02 of 1) unqualified
    assert md_cells(verdicts, "cell") == ["cell", "absolute: vs none", "position_free: vs none"]
    assert md_cells(verdicts, "learned_1d")[1:] == ["beats none", "equivalent to none"]
    assert md_cells(verdicts, "rope_axial")[1:] == ["beats none", "below none"]
    absolute = md.split("task=absolute: Each cell against the baseline none")[1].split("task=position_free")[0]
    free = md.split("task=position_free: Each cell against the baseline none")[1]
    assert md_cells(absolute, "pos_encoding")[:10] == ["pos_encoding", "accuracy", "Δ vs none", "p", "Holm p",
                                                       "≡ ±0.02 Holm p", "Δ vs best", "p", "Holm p", "≡ ±0.02 Holm p"]
    assert md_cells(absolute, "learned_1d")[2:4] == ["+0.5500", "<0.001"]
    assert md_cells(free, "learned_1d")[2] == "+0.0010" and md_cells(free, "learned_1d")[5] == "<0.001 (equivalent)"
    assert md_cells(free, "rope_axial")[5] == "1.000"  # 0.05 below: outside the margin
    line = next(row for row in md.splitlines() if row.startswith("**Our result**") or "Our result" in row)
    assert "task=absolute: expected: none at chance" in line
    assert "task=absolute: every other cell beats none" in line and "task=position_free: " in line
    assert "task=position_free: equivalent to none within ±0.02 (TOST, Holm): learned_1d; not shown equivalent, " \
           "outside the margin: rope_axial" in line
    assert "equivalence: two one-sided Welch tests (TOST) of |Δ| < 0.02" in md and ALPHA == 0.05


def test_a_panel_needs_one_baseline_cell_in_each_of_its_values():
    ab = make("tasks", ENC, TASK, [{ENC: ["none", "learned_1d"], TASK: ["absolute", "relative"]}])
    with pytest.raises(ValueError, match="matches 2 cells, needs exactly 1$"):
        dataclasses.replace(ab, baseline={ENC: "none"})  # one per task: only a panel allows that
    assert dataclasses.replace(ab, baseline={ENC: "none"}, panel=TASK).panel == TASK
    with pytest.raises(ValueError, match="matches 2 cells, needs exactly 1 in each data.task"):
        dataclasses.replace(ab, baseline={TASK: "absolute"}, panel=TASK)  # two cells of one task
    with pytest.raises(ValueError, match="panel 'model.pos_injection' needs the grid layout and a swept key"):
        dataclasses.replace(ab, panel="model.pos_injection")

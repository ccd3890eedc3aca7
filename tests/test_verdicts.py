"""The verdict grid every table opens with: one cell a row, one question a column, the expected verdict beside."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_results import ENC, INJ, make, md_cells, table, write_run

from vit_lightning import ablation as ablations
from vit_lightning.commands.results.verdicts import margin_note, passing_std, versus
from vit_lightning.records.stats import Comparison, tost_p


def spread(mean: float, std: float, n: int) -> list[float]:
    """n values with exactly this mean and sample std (ddof=1)."""
    z = np.linspace(-1, 1, n)
    return list(mean + std * z / z.std(ddof=1))


@pytest.mark.parametrize("n", [3, 5, 8])
def test_the_passing_std_is_where_tost_turns(n):
    """Two cells of equal mean: TOST within 0.02 passes just below the printed std and fails just above it."""
    bound = passing_std(0.02, n)
    below, above = bound * 0.98, bound * 1.02
    assert tost_p(spread(0.5, below, n), spread(0.5, below, n), 0.02) < 0.05
    assert tost_p(spread(0.5, above, n), spread(0.5, above, n), 0.02) > 0.05
    assert n != 5 or round(bound, 3) == 0.017  # the bound the issue measured for 5 seeds


def test_equivalence_at_the_floor_and_the_ceiling_says_so():
    same = Comparison(0.0, 0.9, 0.9, 5, 0.01)  # Holm p 0.9 for a difference, 0.01 for equivalence
    assert versus(same, "none", (0.252, 0.255), 0.02, 0.25) == "equivalent: both at chance"
    assert versus(same, "none", (0.995, 0.998), 0.02, 0.25) == "equivalent: both saturated"
    assert versus(same, "none", (0.6, 0.61), 0.02, 0.25) == "equivalent to none"
    assert versus("baseline", "none", (0.25, 0.251), 0.02, 0.25) == "baseline, at chance"
    note = margin_note(0.02, "why", {"a": (0.01, 5), "b": (0.05, 5)})
    assert "below 0.0170 at n=5" in note and "too noisy for it here: b (0.0500)" in note and note.endswith("why")


def test_a_grid_table_opens_with_its_verdicts_beside_the_expected(tmp_path):
    grids = [{ENC: ["none", "learned_1d", "sincos_2d", "rope_axial"], INJ: ["stem"]}]
    ab = dataclasses.replace(make("verdicts", ENC, INJ, grids, seeds=(0, 1, 2, 3, 4), baseline={ENC: "none"}),
                             equivalence_margin=0.02, chance=0.25, equivalence_note="16 of 800 images",
                             expected_verdicts={"": {"*": "answers"}}, columns=ablations.SHUFFLE_COLUMN)
    accs = {"none": spread(0.25, 0.003, 5), "learned_1d": spread(0.251, 0.003, 5), "sincos_2d": spread(0.9, 0.01, 5),
            "rope_axial": spread(0.5, 0.2, 5)}
    drops = {"none": spread(0.0, 0.001, 5), "learned_1d": spread(0.0, 0.001, 5), "sincos_2d": spread(0.6, 0.01, 5),
             "rope_axial": spread(0.0, 0.001, 5)}
    for enc, values in accs.items():
        for seed, acc in enumerate(values):
            write_run(tmp_path / "runs", ab, {ENC: enc, INJ: "stem"}, seed, acc,
                      extra_metrics={"val/shuffle_drop": drops[enc][seed]})
    _, md = table(ab, tmp_path)
    assert md.index("## Verdicts") < md.index("- **Source")  # the table opens with it
    grid = md[md.index("## Verdicts"):md.index("- **Source")]
    assert md_cells(grid, "cell") == ["cell", "vs none", "expected", "position use"]
    assert md_cells(grid, "none/stem") == ["none/stem", "baseline, at chance", "-", "baseline"]
    assert md_cells(grid, "learned_1d/stem")[1:3] == ["equivalent: both at chance", "answers"]
    assert md_cells(grid, "sincos_2d/stem")[1:] == ["answers", "answers", "used, helps"]
    assert md_cells(grid, "rope_axial/stem")[1].startswith("not settled (Holm p ")
    assert md_cells(grid, "rope_axial/stem")[3].startswith("use not shown (Holm p ")
    assert f"below {passing_std(0.02, 5):.4f} at n=5" in grid and "rope_axial/stem (0.2000)" in grid
    assert "the margin: 16 of 800 images" in grid


def test_a_cell_still_rising_is_not_ranked_in_a_settling_profile(tmp_path):
    """A cell whose seeds rose by more than 0.02 over their last two epochs reads 'not settled (still rising)' in the
    verdict grid where the settle table flags it, whatever its test against none says; elsewhere it is ranked."""
    grids = [{ENC: ["none", "learned_1d", "sincos_2d"], INJ: ["stem"]}]
    base = dataclasses.replace(make("rising", ENC, INJ, grids, seeds=(0, 1, 2, 3, 4), baseline={ENC: "none"}),
                               chance=0.25)
    settling = dataclasses.replace(base, profiles={"demo": dataclasses.replace(base.profiles["demo"], settle=True)})
    curves = {"none": [0.25, 0.25, 0.25], "learned_1d": [0.5, 0.8, 0.9],  # +0.40 over the last two: still rising
              "sincos_2d": [0.9, 0.905, 0.91]}  # +0.01: settled
    accs = {"none": spread(0.25, 0.003, 5), "learned_1d": spread(0.9, 0.01, 5), "sincos_2d": spread(0.91, 0.01, 5)}
    for ab, root in ((settling, tmp_path / "settle"), (base, tmp_path / "plain")):
        for enc, values in accs.items():
            for seed, acc in enumerate(values):
                history = [{"epoch": e, "val/acc": a} for e, a in enumerate(curves[enc])]
                write_run(root / "runs", ab, {ENC: enc, INJ: "stem"}, seed, acc, history=history)
        _, md = table(ab, root)
        grid = md[md.index("## Verdicts"):md.index("- **Source")]
        ranked = md_cells(grid, "learned_1d/stem")[1]
        assert ranked == ("not settled (still rising)" if ab is settling else "answers")
        assert md_cells(grid, "sincos_2d/stem")[1] == "answers"
        assert md_cells(grid, "none/stem")[1] == "baseline"  # the reference keeps its role

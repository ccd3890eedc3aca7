"""A profile's budget settles: epochs to 0.9 per cell, cells still rising flagged, the learning curves drawn."""

import pandas as pd

from vit_lightning.ablation import Ablation, profile
from vit_lightning.commands.results.settle import ceiling_tables, draw_curves, epochs_to, last_rise, settling_table
from vit_lightning.records.shapes import Data


def history(accs):
    return [{"epoch": i, "val/acc": a} for i, a in enumerate(accs)]


def test_epochs_to_a_level_and_the_last_two_epochs_rise_by_hand():
    h = history([0.25, 0.5, 0.91, 0.93, 0.96])
    assert epochs_to(h) == 3 and epochs_to(h, 0.95) == 5 and epochs_to(h, 0.99) is None
    assert abs(last_rise(h) - (0.96 - 0.91)) < 1e-12 and last_rise(history([0.3, 0.4])) is None
    assert epochs_to([{"epoch": 0, "val/acc": None}, *h]) == 3  # an epoch without validation is not counted


def test_the_table_flags_a_cell_still_rising_and_names_seeds_that_never_reached_the_level(tmp_path):
    prof = profile("demo", {"model.pos_encoding": ["none", "learned_1d"]}, seeds=[0, 1])
    ab = Ablation("t", "T", "ours", "f", "val/acc_best", "model.pos_encoding", None, {}, "", {"demo": prof})
    runs = pd.DataFrame({"name": ["a0", "a1", "b0", "b1"], "cell": [0, 0, 1, 1], "note": ["", "", "", ""]})
    cells = pd.DataFrame({"model.pos_encoding": ["none", "learned_1d"]})
    flat, rising = [0.25, 0.26, 0.25, 0.25], [0.3, 0.6, 0.85, 0.92]
    data = Data(ab, prof, runs, cells, {"a0": history(flat), "a1": history(flat), "b0": history(rising),
                                        "b1": history([0.3, 0.5, 0.9, 0.95])})
    rows = settling_table(data).rows
    assert rows[0] == ["none", "4", "- (2 of 2 never)", "-0.010", "settled"]  # 0.25 - 0.26
    # learned_1d: rises 0.92 - 0.6 and 0.95 - 0.5, mean 0.385 > 0.02; the seeds reach 0.9 at epochs 4 and 3
    assert rows[1] == ["learned_1d", "4", "3.5", "+0.385", "still rising"]
    draw_curves(tmp_path / "c.png", [("none/absolute", [1, 2], [0.25, 0.3], [0.01, 0.02])], "T")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_the_oracle_ceilings_become_a_reference_table():
    prof = profile("demo", {"model.pos_encoding": ["none"]}, seeds=[0])
    assert ceiling_tables(prof) == []
    import dataclasses
    table = ceiling_tables(dataclasses.replace(prof, ceilings={"relative": {"place": 0.43, "distance": 0.23}}))[0]
    assert table.rows == [["relative", "place", "0.430", "above chance"], ["relative", "distance", "0.230", "at chance"]]

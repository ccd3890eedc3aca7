"""A bayes journal of the right shape is checked value by value before the first trial: a value that is not a
number, not finite, outside its range, or a proposal whose id is not its point's trial is one line naming the
journal and `--repair`, which rebuilds it from the records; the run cap holds whatever the journal lists."""

from __future__ import annotations

import json

import pytest
import yaml
from test_sweep_search import config, drive

from vit_lightning.commands.sweep import cli, repair
from vit_lightning.commands.sweep.search import Search

LR, WD = "model.lr", "model.weight_decay"


def damaged(proposals: list[dict], how: str) -> tuple[list[dict], str]:
    """The journal's proposals with one value broken, and the words the check must say."""
    first = json.loads(json.dumps(proposals))  # a copy
    raw = first[0]["raw"]
    if how == "a string":
        raw[LR] = "0.001"
        return first, f"proposal 1's {LR} is '0.001', not a number"
    if how == "NaN":
        raw[WD] = float("nan")
        return first, f"proposal 1's {WD} is nan, not a finite number"
    if how == "out of range":
        raw[WD] = 1.5  # the space is [0, 1]
        return first, f"proposal 1's {WD} is 1.5, outside its range [0, 1]"
    if how == "a parameter missing":
        del raw[LR]
        return first, f"proposal 1's {LR} is missing"
    if how == "an id no point makes":
        first[1]["id"] = "no-such-trial"
        return first, "proposal 2's id 'no-such-trial' is not its point's trial ("
    first.append(first[0])
    return first, f"proposal 3 repeats trial {first[0]['id']}"


@pytest.mark.parametrize("how", ["a string", "NaN", "out of range", "a parameter missing", "an id no point makes",
                                 "a trial twice"])
def test_bad_values_name_the_journal_and_repair_rebuilds_it(tmp_path, capsys, how):
    runs = tmp_path / "runs"
    search = Search(config(runs, 2), 2)
    assert len(drive(search)) == 2  # two finished proposals, each with its record
    good = search.proposals()
    broken, words = damaged(good, how)
    text = json.dumps({"proposals": broken})
    search.journal.write_text(text)
    path = tmp_path / "bayes.yaml"
    path.write_text(yaml.safe_dump(config(runs, 2)))
    for extra in (["--dry-run"], []):
        assert cli.main([str(path), "--backend", "local", *extra]) == 2
        out, err = capsys.readouterr()
        [line] = err.strip().splitlines()
        assert line.startswith(f"vit-ablate sweep: error: {search.journal}: damaged bayes journal ({words}")
        assert "run again with --repair to rebuild it from the records" in line and out == ""
    assert search.journal.read_text() == text  # nothing written before --repair
    said = []
    repair.check([], [Search(config(runs, 2), 2)], repair=True, dry_run=False, log=said.append)
    assert f"damaged bayes journal ({words}" in said[0] and "rebuilt from the records: 2 proposal(s)" in said[0]
    rebuilt = Search(config(runs, 2), 2).proposals()
    assert sorted(p["id"] for p in rebuilt) == sorted(p["id"] for p in good)  # the records have no start times
    assert repair.journal_values(search, {"proposals": rebuilt}) is None


def test_the_cap_holds_whatever_the_journal_lists(tmp_path):
    three = Search(config(tmp_path, 3), 3)
    started = [three.next() for _ in range(3)]  # three proposals, none finished (a sweep killed at once)
    assert all(started) and len(three.proposals()) == 3
    two = Search(config(tmp_path, 2), 2)  # the same search (the cap is not part of it), run_cap: 2
    handed = []
    while (trial := two.next()) is not None:
        handed.append(trial.id)
    assert handed == [t.id for t in started[:2]]  # the first two proposals, and no third

"""Designs are data: a profile lists its cells by name, so a registry entry added later changes no committed design."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from vit_lightning import ablation
from vit_lightning.commands.sweep import trials, yamls
from vit_lightning.model import ENCODINGS, FAMILIES, registered_names
from vit_lightning.model.family import Option
from vit_lightning.model.position import Learned1d

REPO = Path(__file__).resolve().parents[1]
NEW = "learned_1d_again"  # an encoding registered by the test only


def every_ablation() -> list[ablation.Ablation]:
    return [ablation.load(name) for name in ablation.available()]


def designs() -> dict[str, tuple]:
    """Each profile's trials and the trial ids its sweep gives them, by ablation/profile."""
    out = {}
    for ab in every_ablation():
        for name, prof in ab.profiles.items():
            ids = [t.id for t in trials.build([config for _, config in yamls.sweep_configs(ab, name)])]
            out[f"{ab.name}/{name}"] = (repr(prof.trials()), ids)
    return out


def test_every_registered_name_is_run_by_a_profile_or_listed_with_a_reason():
    abls = every_ablation()
    for key, names in registered_names().items():
        assert ablation.uncovered(key, names, abls) == [], f"{key}: sweep these in a new profile or list them in not_swept"


def test_a_name_listed_as_not_swept_is_registered_and_not_run():
    """A stale reason (the name is swept after all, or no longer registered) fails by name."""
    abls, registered = every_ablation(), registered_names()
    for ab in abls:
        for key, reasons in ab.not_swept.items():
            assert set(reasons) <= set(registered[key]), (ab.name, key)
            assert not set(reasons) & ablation.runs_values(abls, key), (ab.name, key)


def test_pos_encoding_lists_every_cell_by_name():
    """The grids are literals: the demo_all profile is the 18 cells the registry had when it was run, not the registry."""
    source = (REPO / "ablations" / "pos_encoding.py").read_text()
    assert "ENCODINGS" not in source and "itertools" not in source
    demo_all = ablation.load("pos_encoding").profile("demo_all")
    assert len(demo_all.cells()) == 1 + 2 * 3 + 2 + 7 + 2  # none; learned x3 injections; sincos x2; 7 at stem; peg x2


def test_uncovered_counts_swept_and_fixed_values_and_the_reasons():
    prof = ablation.profile("demo", {"model.pooling": ["cls"]}, fixed={"model.head": "linear"})
    ab = ablation.Ablation(name="t", title="t", source="t", finding="t", metric="m", rows="model.pooling", cols=None,
                           reference={}, reference_note="", profiles={"demo": prof},
                           not_swept={"model.pooling": {"map": "later"}})
    assert ablation.uncovered("model.pooling", ["cls", "gap", "map"], [ab]) == ["gap"]
    assert ablation.uncovered("model.head", ["linear", "mlp_tanh"], [ab]) == ["mlp_tanh"]
    with pytest.raises(ValueError, match="not_swept"):
        dataclasses.replace(ab, not_swept={"model.pooling": {"map": " "}})


@pytest.mark.slow
def test_a_new_encoding_and_option_change_no_committed_design(monkeypatch):
    """Registered in model/ alone: no committed sweep YAML, profile's trials or trial id changes; coverage names it."""
    before = designs()

    class Again(Learned1d):
        """The same table under another name."""

    vit = FAMILIES["vit"]
    monkeypatch.setitem(ENCODINGS, NEW, Again)
    monkeypatch.setitem(FAMILIES.entries, "vit", dataclasses.replace(
        vit, encodings=(*vit.encodings, NEW), options={**vit.options, "later": Option(0, int, "vit: added later.")}))
    for name in [m for m in sys.modules if m.startswith(ablation.PACKAGE + ".")]:
        monkeypatch.delitem(sys.modules, name)  # the ablation files read again, under the grown registry
    assert yamls.out_of_sync(REPO / "sweeps") == []
    assert designs() == before
    abls = every_ablation()
    assert ablation.uncovered("model.pos_encoding", registered_names()["model.pos_encoding"], abls) == [NEW]

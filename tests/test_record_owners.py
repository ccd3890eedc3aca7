"""A record belongs to (ablation, profile, trial): no profile's table replaces another's records or table, a
committed record gives way to another run's only when asked, and the tables built from a folder's records follow."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from test_results import ENC, make, write_run

from vit_lightning import ablation as ablations
from vit_lightning.ablation import Profile
from vit_lightning.commands.results import cli

FIRST = {"none": 0.40, "learned_1d": 0.60}  # accuracy per cell, seed s adds 0.01 * s


def ablation():
    """A grid ablation with a demo, a pilot (the demo's cells and seeds, other settings) and a replicate draw."""
    ab = make("owners", ENC, None, [{ENC: ["none", "learned_1d"]}], seeds=(0, 1, 2), baseline={ENC: "none"})
    demo = ab.profiles["demo"]
    pilot = Profile("pilot", {**demo.fixed, "trainer.max_epochs": 1}, demo.grids, demo.seeds, "test")
    replicate = Profile("replicate", demo.fixed, demo.grids, (3, 4, 5), "test")
    return dataclasses.replace(ab, profiles={"demo": demo, "pilot": pilot, "replicate": replicate})


def runs(root: Path, ab, profile: str, shift: float, hour: int, seeds=(0, 1, 2), lift: float = 0.0) -> None:
    """One run per cell and seed, named by cell and seed only (so profiles share trial names); `lift`: learned_1d's
    accuracy raised further."""
    fixed = ab.profiles[profile].fixed
    for encoding, acc in FIRST.items():
        for seed in seeds:
            write_run(root, ab, {ENC: encoding}, seed, acc + shift + 0.01 * seed + lift * (encoding != "none"), name=f"{encoding}-s{seed}",
                      hour=hour, profile=profile, **{k: v for k, v in fixed.items() if k != "data.name"})


def table(ab, *argv: str) -> int:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ablations, "load", lambda name, directory=None: ab)
        return cli.main([ab.name, "--no-figures", *argv])


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_profile_never_replaces_the_first_profiles_records_or_table(tmp_path, monkeypatch, capsys):
    ab, root, out = ablation(), tmp_path / "runs", tmp_path / "results" / "owners"
    monkeypatch.chdir(tmp_path)
    runs(root, ab, "demo", 0.0, hour=10)
    assert table(ab, "--runs", str(root)) == 0  # the demo's default folder: results/owners
    first = snapshot(out)
    assert len([name for name in first if name.startswith("records/")]) == 6
    runs(root, ab, "pilot", 0.3, hour=12)  # newer runs with the demo's trial names
    capsys.readouterr()
    assert table(ab, "--profile", "pilot", "--runs", str(root)) == 0  # its own folder by default
    assert snapshot(out / "pilot") and {k: v for k, v in snapshot(out).items() if not k.startswith("pilot/")} == first
    assert table(ab, "--profile", "pilot", "--runs", str(root), "--out", str(out)) == 2  # not over the demo's table
    assert f"{out} holds the table of `vit-ablate table owners --profile demo`" in capsys.readouterr().err
    assert table(ab, "--profile", "pilot", "--runs", str(root), "--out", str(out), "--replace") == 0  # asked
    err = capsys.readouterr().err
    assert err.count("vit-ablate table: added the pilot record") == 6 and "replaced" not in err  # named one by one, beside the demo's
    assert "--profile pilot" in (out / "table.md").read_text()
    assert table(ab, "--runs", str(tmp_path / "none"), "--out", str(out), "--replace") == 0  # the demo's, again
    now = snapshot(out)
    assert {k: now[k] for k in first} == first  # its records and its table byte for byte
    assert len([k for k in now if k.startswith("records/")]) == 12


def test_the_same_trials_run_again_replace_the_stored_records_only_when_asked(tmp_path, monkeypatch, capsys):
    ab, root, out = ablation(), tmp_path / "runs", tmp_path / "results" / "owners"
    monkeypatch.chdir(tmp_path)
    runs(root, ab, "demo", 0.0, hour=10)
    assert table(ab, "--runs", str(root)) == 0
    first = snapshot(out)
    shutil.rmtree(root)
    runs(root, ab, "demo", 0.2, hour=14)  # the main job again: the same trial names, another draw
    capsys.readouterr()
    assert table(ab, "--runs", str(root)) == 0
    err = capsys.readouterr().err
    assert snapshot(out) == first and "kept 6 finished record(s) of other runs" in err and "--replace" in err
    assert table(ab, "--runs", str(root), "--replace") == 0
    err = capsys.readouterr().err
    assert sorted(line.split()[6] for line in err.splitlines() if "table: replaced the demo record" in line) == sorted(
        f"{e}-s{s}" for e in FIRST for s in (0, 1, 2))
    assert "0.6100 ± 0.0100 (n=3)" in (out / "table.md").read_text()  # none: 0.6, 0.61, 0.62


def test_tables_built_from_rewritten_records_are_rebuilt(tmp_path, monkeypatch):
    """A table in another metric (its records a copy) and a second draw compared with the folder follow its
    records: after --replace each equals the table made afresh from the new records."""
    ab, root, out = ablation(), tmp_path / "runs", tmp_path / "results" / "owners"
    monkeypatch.chdir(tmp_path)
    runs(root, ab, "demo", 0.0, hour=10)
    runs(root, ab, "replicate", 0.05, hour=10, seeds=(3, 4, 5))
    assert table(ab, "--runs", str(root)) == 0
    assert table(ab, "--runs", str(root), "--metric", "val/acc", "--out", str(out / "acc")) == 0
    shutil.copytree(out / "records", out / "acc" / "records", dirs_exist_ok=True)
    assert table(ab, "--profile", "replicate", "--runs", str(root), "--compare-with", str(out)) == 0
    before = {k: v for k, v in snapshot(out).items() if k.startswith(("acc/", "replicate/"))}
    shutil.rmtree(root / "owners" / "demo")
    runs(root, ab, "demo", 0.0, hour=14, lift=0.15)
    assert table(ab, "--runs", str(root), "--replace") == 0
    fresh = tmp_path / "fresh" / "owners"
    shutil.copytree(out / "records", fresh / "records")
    shutil.copytree(out / "records", fresh / "acc" / "records")
    assert table(ab, "--runs", str(tmp_path / "none"), "--metric", "val/acc", "--out", str(fresh / "acc")) == 0
    shutil.copytree(out / "replicate" / "records", fresh / "replicate" / "records")
    assert table(ab, "--profile", "replicate", "--runs", str(tmp_path / "none"), "--out", str(fresh / "replicate"),
                 "--compare-with", str(out)) == 0
    after = snapshot(out)
    for name in ("acc/table.md", "acc/runs.csv", "replicate/table.md"):
        assert after[name] != before[name] and after[name] == (fresh / name).read_bytes(), name


def test_the_main_job_with_replace_leaves_the_committed_results_consistent(tmp_path, monkeypatch):
    """The README's main job on a copy of results/pos_encoding: another draw of its 56 trials, tabulated with
    --replace, leaves every table in the folder equal to the one made afresh from the records it holds (what
    tests/test_committed_results.py checks), the few-shot and replicate tables included."""
    committed = Path(__file__).resolve().parent.parent / "results" / "pos_encoding"
    out = tmp_path / "results" / "pos_encoding"
    shutil.copytree(committed, out, ignore=shutil.ignore_patterns("*.png", "figures"))
    for k, path in enumerate(sorted((committed / "records").glob("*.json"))):
        record = json.loads(path.read_text())
        record["started_at"] = "2030-01-01T00:00:00+00:00"  # another run of the same trial
        for metric in ("val/acc_best", "val/fewshot5"):
            record["metrics"][metric] = round(record["metrics"][metric] - 0.001 * (k % 7), 6)
        run = tmp_path / "runs" / "pos_encoding" / "demo" / record["name"]
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["pos_encoding", "--no-figures", "--replace"]) == 0
    for folder, argv in (("", []), ("fewshot5", ["--metric", "val/fewshot5"]),
                         ("replicate", ["--profile", "replicate", "--compare-with", "results/pos_encoding"])):
        fresh = tmp_path / "fresh" / (folder or "demo")
        shutil.copytree(out / ("replicate" if folder == "replicate" else "") / "records", fresh / "records")
        assert cli.main(["pos_encoding", "--runs", "none", "--out", str(fresh), "--no-figures", *argv]) == 0
        for name in ("table.md", "runs.csv"):
            assert (out / folder / name).read_text() == (fresh / name).read_text(), f"{folder}/{name}"
        assert (out / folder / "table.md").read_bytes() != (committed / folder / "table.md").read_bytes()

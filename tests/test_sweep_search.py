"""`method: bayes` on the local backend: the space, the search against random, resuming and sharing it."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vit_lightning.commands.sweep import cli, expand, search
from vit_lightning.commands.sweep.search import Search, value


def config(root: Path, cap: int | None = None, method: str = "bayes") -> dict:
    """A 2-D search (lr over four decades, weight decay in [0, 1]) writing under root."""
    return {"method": method, "metric": {"name": "val/acc_best", "goal": "maximize"},
            "command": ["${env}", "vit-ablate", "fit", "${args}"], **({"run_cap": cap} if cap else {}),
            "parameters": {"model.lr": {"distribution": "log_uniform_values", "min": 1e-5, "max": 1e-1},
                           "model.weight_decay": {"min": 0.0, "max": 1.0},
                           "run.root": {"value": str(root)}, "seed_everything": {"value": 0}}}


def bowl(params: dict) -> float:
    """A known metric: 0 at lr 10^-2.5 and weight decay 0.3, falling off quadratically."""
    return -(math.log10(params["model.lr"]) + 2.5) ** 2 - 4 * (params["model.weight_decay"] - 0.3) ** 2


def finish(trial, metric: float) -> None:
    """Write the completed record fit would write."""
    trial.run_dir.mkdir(parents=True, exist_ok=True)
    record = {"trial": trial.id, "status": "completed", "config": trial.params, "metrics": {"val/acc_best": metric}}
    (trial.run_dir / "results.json").write_text(json.dumps(record))


def drive(s: Search) -> list[float]:
    """Run a search to its cap, each trial finishing at once with bowl's value; the values in order."""
    values = []
    while (trial := s.next()) is not None:
        finish(trial, bowl(trial.params))
        values.append(bowl(trial.params))
    return values


def test_every_wandb_distribution_maps_to_its_values():
    rng = random.Random(0)
    specs = {"c": ("constant", {"value": 3}), "k": ("categorical", {"values": [[1, 2], "a"]}),
             "i": ("int_uniform", {"min": 2, "max": 5}), "u": ("uniform", {"min": -1, "max": 1}),
             "qu": ("q_uniform", {"min": 0, "max": 10, "q": 2}), "lv": ("log_uniform_values", {"min": 1e-4, "max": 1e-2}),
             "lu": ("log_uniform", {"min": 0, "max": 2}), "qlv": ("q_log_uniform_values", {"min": 1, "max": 1000, "q": 5}),
             "n": ("normal", {"mu": 2, "sigma": 3}), "ln": ("log_normal", {"mu": 0, "sigma": 1}),
             "b": ("beta", {"a": 2, "b": 2})}
    for dist, spec in specs.values():
        d = search.distribution(dist, spec)
        if d is None:
            assert value(dist, spec, None) == 3
            continue
        kind = type(d).__name__
        for _ in range(20):
            raw = (rng.choice(d.choices) if kind == "CategoricalDistribution" else
                   rng.randint(d.low, d.high) if kind == "IntDistribution" else rng.uniform(d.low, d.high))
            x = value(dist, spec, raw)
            if dist == "categorical":
                assert x in spec["values"]
            elif dist == "int_uniform":
                assert isinstance(x, int) and 2 <= x <= 5
            elif dist == "q_uniform":
                assert x % 2 == 0 and 0 <= x <= 10
            elif dist == "q_log_uniform_values":
                assert x % 5 == 0 and 0 <= x <= 1000
            elif dist == "log_uniform":  # bounds in log space: e^0 .. e^2
                assert 1 <= x <= math.e**2
            elif "min" in spec:
                assert spec["min"] <= x <= spec["max"]
    # a normal's and a beta's quantiles: the median is mu (e^mu for log_normal), a symmetric beta's 0.5
    assert value("normal", specs["n"][1], 0.5) == pytest.approx(2)
    assert value("normal", specs["n"][1], 0.8413447) == pytest.approx(5, abs=1e-4)  # one sigma up
    assert value("log_normal", specs["ln"][1], 0.5) == pytest.approx(1)
    assert value("beta", specs["b"][1], 0.5) == pytest.approx(0.5)


def test_bayes_finds_the_optimum_where_random_search_cannot(tmp_path):
    """Within 14 trials bayes gets within 0.001 of the best metric, at each of two seeds.

    Random search's chance of that: the region where bowl > -0.001 is an ellipse of half-axes sqrt(0.001) decades
    by sqrt(0.001/4) in weight decay, area pi * 0.001 / 2 = 0.00157, of the 4 x 1 space: p = 0.00039 per draw,
    1 - (1 - p)^14 = 0.0055 per seed, 3e-5 for both seeds. The seeded random sweep of the same space is shown
    to fall short too (its draws, not chance, at these seeds).
    """
    cap = 14
    for seed in (0, 1):
        bayes = drive(Search(config(tmp_path / f"b{seed}", cap), cap, seed=seed))
        assert len(bayes) == cap and max(bayes) > -0.001, bayes
        draws = expand.expand(config(tmp_path, cap, "random"), seed=seed)
        assert max(map(bowl, draws)) < -0.001


def test_proposals_are_reproducible_and_a_cap_holds(tmp_path):
    first = Search(config(tmp_path / "a", 5), 5, seed=3)
    drive(first)
    again = Search(config(tmp_path / "b", 5), 5, seed=3)
    drive(again)
    points = lambda s: [p["raw"] for p in s.proposals()]  # noqa: E731
    assert points(first) == points(again) and len(points(first)) == 5
    assert first.next() is None  # at its cap
    other = Search(config(tmp_path / "c", 5), 5, seed=4)
    drive(other)
    assert points(other) != points(first)


def test_a_rerun_finishes_unfinished_proposals_before_new_ones(tmp_path):
    s = Search(config(tmp_path, 4), 4)
    a, b = s.next(), s.next()  # both handed out; b is never finished (its process was killed)
    finish(a, bowl(a.params))
    rerun = Search(config(tmp_path, 4), 4)  # a new process: nothing claimed yet
    assert rerun.next().id == b.id  # b again, not a new point
    assert len(rerun.proposals()) == 2
    finish(b, bowl(b.params))
    assert rerun.next().id not in {a.id, b.id}
    assert rerun.done() == 2


def bayes_sweep(stand_in, cap: int) -> str:
    """The stand-in fit searched by bayes over lr (its metric is 1 - |log10 lr + 2.5|) and pooling."""
    config = yaml.safe_load(Path(stand_in.sweep()).read_text())
    config["method"], config["run_cap"] = "bayes", cap
    config["parameters"]["model.lr"] = {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-1}
    path = stand_in.tmp_path / "bayes.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def sweep_cmd(path: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vit_lightning.cli", "sweep", path, "--backend", "local", *extra]


def test_dry_run_says_the_space_the_cap_and_how_far(stand_in, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_MARKER", str(stand_in.marker))
    path = bayes_sweep(stand_in, 3)
    assert cli.main([path, "--backend", "local"]) == 0
    capsys.readouterr()
    assert cli.main([path, "--backend", "local", "--dry-run", "--count", "5"]) == 0
    out = capsys.readouterr().out
    assert "model.lr log_uniform_values" in out and "model.pooling categorical" in out and "cap 3" in out  # run_cap
    assert "3 proposed, 3 done" in out and not (stand_in.tmp_path / "runs" / "fake" / "demo" / "x").exists()


@pytest.mark.slow  # sweep processes
def test_sigkilled_bayes_sweep_reruns_to_finish_every_trial_once(stand_in):
    path, gate = bayes_sweep(stand_in, 6), stand_in.tmp_path / "gate"
    env = {**os.environ, "FAKE_MARKER": str(stand_in.marker), "FAKE_GATE": str(gate), "OMP_NUM_THREADS": "1"}
    gate.touch()
    subprocess.run(sweep_cmd(path, "--count", "3"), env=env, check=True, capture_output=True, timeout=300)
    gate.unlink()  # the 4th trial holds at the gate: the machine dies there
    proc = subprocess.Popen(sweep_cmd(path), env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while sum(e.startswith("start") for e in stand_in.events()) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    running = [t for t in stand_in.state().values() if t.get("status") == "running"]
    os.killpg(running[0]["pid"], signal.SIGKILL)
    gate.touch()
    rerun = subprocess.run(sweep_cmd(path), env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    starts = [e.split()[1] for e in stand_in.events() if e.startswith("start")]
    ends = [e.split()[1] for e in stand_in.events() if e.startswith("end")]
    assert len(set(starts)) == 6 and len(starts) == 7  # the killed trial started twice, every other once
    assert sorted(ends) == sorted(set(starts))  # each of the 6 ran to its end exactly once
    folder = stand_in.tmp_path / "runs" / "fake" / "demo"
    assert sorted(search.ids_of(folder)) == sorted(ends)
    assert {json.loads(p.read_text())["status"] for p in folder.glob("*/results.json")} == {"completed"}


@pytest.mark.slow  # sweep processes
def test_two_sweeps_on_one_root_share_one_search(stand_in):
    path = bayes_sweep(stand_in, 8)
    env = {**os.environ, "FAKE_MARKER": str(stand_in.marker), "FAKE_SLEEP": "0.4", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(sweep_cmd(path), env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    starts = [e.split()[1] for e in stand_in.events() if e.startswith("start")]
    assert len(starts) == len(set(starts)) == 8  # 8 points, none trained twice
    assert all("started" in log for log in logs)  # both took part
    assert sorted(search.ids_of(stand_in.tmp_path / "runs" / "fake" / "demo")) == sorted(starts)


def test_a_searched_profile_table_counts_its_spend_against_the_grid(tmp_path):
    """demo_bayes's table from canned search records, against the committed cls_vs_gap demo grid."""
    from vit_lightning.commands.results import cli as table_cli

    repo_grid = Path(__file__).resolve().parent.parent / "results" / "cls_vs_gap"
    folder = tmp_path / "runs" / "cls_vs_gap" / "demo_bayes"
    canned = [("cls", "mlp_tanh", 0.002, "completed", 20, 0.93), ("cls", "mlp_tanh", 0.007, "stopped_early", 3, 0.5),
              ("cls", "mlp_tanh", 0.0006, "completed", 20, 0.9), ("gap", "linear", 0.0009, "completed", 20, 0.95)]
    for k, (pool, head, lr, status, epochs, acc) in enumerate(canned):
        (folder / f"t{k}").mkdir(parents=True)
        config = {"model.pooling": pool, "model.head": head, "model.lr": lr, "seed_everything": 0}
        record = {"name": f"t{k}", "trial": f"t{k}", "ablation": "cls_vs_gap", "profile": "demo_bayes",
                  "status": status, "config": config, "metrics": {"val/acc_best": acc},
                  "history": [{"epoch": e, "val/acc": acc} for e in range(epochs)],
                  **({"stopped_early": "hyperband: val/acc_best 0.5 at bracket 3"} if status == "stopped_early" else {})}
        (folder / f"t{k}" / "results.json").write_text(json.dumps(record))
    out = tmp_path / "out"
    assert table_cli.main(["cls_vs_gap", "--profile", "demo_bayes", "--runs", str(tmp_path / "runs"), "--out", str(out),
                           "--compare-with", str(repo_grid), "--no-figures"]) == 0
    text = (out / "table.md").read_text()
    spend = text.split("## bayes search of ")[1]  # the spend table, below the verdict grid
    grid = [json.loads(p.read_text()) for p in (repo_grid / "records").glob("*.json")]
    grid = [r for r in grid if r["profile"] == "demo"]
    epochs = {s: sum(len(r["history"]) for r in grid if (r["config"]["model.pooling"], r["config"]["model.head"]) == s)
              for s in (("cls", "mlp_tanh"), ("gap", "linear"))}
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in spend.splitlines() if line.startswith("| cls/") or line.startswith("| gap/")}
    # cls/mlp_tanh: 3 trials (1 stopped), 43 epochs; best lr 0.002, inside the grid's interval (0.0016 to 0.0027)
    trials = sum(1 for r in grid if (r["config"]["model.pooling"], r["config"]["model.head"]) == ("cls", "mlp_tanh"))
    assert rows["cls/mlp_tanh"][:5] == ["3 (1)", "43", "0.002", "0.9300", str(trials)] and trials > 0
    assert rows["cls/mlp_tanh"][5] == str(epochs[("cls", "mlp_tanh")]) and rows["cls/mlp_tanh"][-1] == "yes"
    # gap/linear: its one trial at 0.0009 lies below the grid's interval (0.0018 to 0.0027)
    assert rows["gap/linear"][:3] == ["1 (0)", "20", "0.0009"] and rows["gap/linear"][-1] == "no"
    assert rows["cls/linear"][:4] == ["0 (0)", "0", "-", "missing"] and rows["cls/linear"][-1] == "-"
    assert "inside the grid's 95% interval for 1 of 3 set-ups (outside: gap/linear)" in text
    assert "| t2 " not in text  # a finished search point is no other's duplicate
    stopped = next(line for line in text.splitlines() if line.startswith("| t1 "))
    assert "stopped early (hyperband: val/acc_best 0.5 at bracket 3)" in stopped

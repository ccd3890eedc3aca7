"""Seed-replicated bayes search: each point at k seeds told as their mean, hyperband stopping a point's seeds
together, and a confirmation stage that trains the top m points on to n seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from vit_lightning.commands.sweep import cli, search
from vit_lightning.commands.sweep.search import Search
from vit_lightning.run import hyperband

LRS = [0.001, 0.002, 0.004, 0.008]
MEAN = {0.001: 0.80, 0.002: 0.85, 0.004: 0.70, 0.008: 0.75}
# seed noise, zero-mean over the five seeds: lr 0.001 has a lucky first draw (0.90, above 0.002's every draw)
NOISE = {0.001: [0.10, -0.04, -0.03, -0.02, -0.01], 0.002: [0.0, 0.01, -0.01, 0.005, -0.005],
         0.004: [0.01, -0.01, 0.0, 0.0, 0.0], 0.008: [0.0, 0.0, 0.01, -0.01, 0.0]}


def draw(params: dict) -> float:
    """The noisy objective: the point's mean plus its seed's noise."""
    return MEAN[params["model.lr"]] + NOISE[params["model.lr"]][params["seed_everything"]]


def config(root: Path, seeds: list[int], cap: int) -> dict:
    return {"method": "bayes", "metric": {"name": "val/acc_best", "goal": "maximize"}, "run_cap": cap,
            "command": ["${env}", "vit-ablate", "fit", "${args}"],
            "parameters": {"model.lr": {"values": LRS}, "run.root": {"value": str(root)},
                           "seed_everything": {"values": seeds} if len(seeds) > 1 else {"value": seeds[0]}}}


def finish(trial, metric: float, status: str = "completed") -> None:
    """Write the record fit would write."""
    trial.run_dir.mkdir(parents=True, exist_ok=True)
    record = {"trial": trial.id, "status": status, "config": trial.params, "metrics": {"val/acc_best": metric}}
    (trial.run_dir / "results.json").write_text(json.dumps(record))


def drive(s: Search) -> list:
    """Run a search to its end, each run finishing at once with its draw; the runs in the order handed out."""
    ran = []
    while (trial := s.next()) is not None:
        finish(trial, draw(trial.params))
        ran.append(trial)
    return ran


def test_the_search_chooses_the_better_mean_over_the_better_single_draw(tmp_path):
    # one seed: the lucky draw of lr 0.001 (0.90) beats lr 0.002 (0.85) and is chosen
    single = Search(config(tmp_path / "one", [0], 4), 4, seed=0)
    assert len(drive(single)) == 4  # every lr proposed once
    assert single.best()[0] == {"model.lr": 0.001} and single.best()[1][0] == pytest.approx(0.90)
    # three seeds, the top two confirmed at five: lr 0.002 (mean 0.85) over lr 0.001 (mean 0.80 at five seeds)
    s = Search(config(tmp_path / "three", [0, 1, 2], 12), 12, seed=0, confirm=(2, 5))
    ran = drive(s)
    firsts = [(t.params["model.lr"], t.params["seed_everything"]) for t in ran[:12]]
    assert sorted(firsts) == sorted((lr, seed) for lr in LRS for seed in (0, 1, 2))  # 4 points x 3 seeds
    # then the top two by their 3-seed mean (0.85 and 0.81) on to seeds 3 and 4
    assert sorted((t.params["model.lr"], t.params["seed_everything"]) for t in ran[12:]) == [
        (0.001, 3), (0.001, 4), (0.002, 3), (0.002, 4)]
    params, (mean, std, n) = s.best()
    values = [MEAN[0.002] + x for x in NOISE[0.002]]
    assert params == {"model.lr": 0.002} and n == 5 and mean == pytest.approx(sum(values) / 5)
    assert std == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / 4))
    assert s.done() == 16 and s.next() is None


def test_the_sampler_is_told_each_points_mean_and_spread(tmp_path, monkeypatch):
    told = []
    real = search.Search.propose

    def spy(self, proposals):
        import optuna.trial

        real_create = optuna.trial.create_trial

        def create(**kwargs):
            told.append((kwargs["params"], kwargs["value"], kwargs["user_attrs"]))
            return real_create(**kwargs)

        monkeypatch.setattr(optuna.trial, "create_trial", create)
        return real(self, proposals)

    monkeypatch.setattr(search.Search, "propose", spy)
    s = Search(config(tmp_path, [0, 1, 2], 6), 6, seed=0)
    drive(s)
    (raw, value, attrs), = told[-1:]  # the second proposal was told the first point
    lr = LRS[raw["model.lr"]]
    values = [draw({"model.lr": lr, "seed_everything": k}) for k in range(3)]
    assert value == pytest.approx(sum(values) / 3) and attrs["seeds"] == 3
    assert attrs["seed_std"] == pytest.approx(math.sqrt(sum((v - value) ** 2 for v in values) / 2))


def test_a_point_stopped_early_is_stopped_whole(tmp_path):
    s = Search(config(tmp_path, [0, 1, 2], 6), 6, seed=0)
    first = s.next()
    finish(first, 0.5, "stopped_early")
    second = s.next()  # not the stopped point's seed 1: the next point's first seed
    assert second.params["model.lr"] != first.params["model.lr"] and second.params["seed_everything"] == 0
    assert s.done() == 3  # the stopped point's three runs are settled
    mean, std, n = s.point_outcome(s.runs(s.proposals()[0]["raw"]))  # told its one finished seed
    assert (mean, n) == (0.5, 1) and math.isnan(std)


def test_confirmation_runs_carry_no_hyperband_rule(tmp_path):
    cfg = {**config(tmp_path, [0, 1, 2], 3), "early_terminate": {"type": "hyperband", "min_iter": 1}}
    cfg["command"] = cli.trials.early_command(cfg)
    s = Search(cfg, 3, confirm=(1, 4))
    flag = f"--{hyperband.OPTION}="
    runs = s.runs({"model.lr": 0}, [0, 3])
    assert any(c.startswith(flag) for c in runs[0].command) and not any(c.startswith(flag) for c in runs[1].command)
    assert json.loads(next(c for c in runs[0].command if c.startswith(flag))[len(flag):])["replicate"] == "seed_everything"


def test_hyperband_judges_a_points_mean_over_its_seeds(tmp_path):
    """Points A (seeds 0, 1) and B (seed 0) and C; eta 2, bracket at epoch 2. By hand: A's mean at epoch 2 is
    (0.9 + 0.5) / 2 = 0.7, B's 0.6, C's 0.8; sorted 0.8, 0.7, 0.6: the threshold is rank floor(3/2) = 1, 0.7.
    A's seed 1 alone (0.5) would stop; its point (0.7) ties the threshold and goes on. B (0.6) stops."""
    rule = hyperband.parse({"type": "hyperband", "min_iter": 2, "eta": 2}, {"name": "val/acc", "goal": "maximize"})

    def rec(lr, seed, values, status="running"):
        return {"status": status, "config": {"model.lr": lr, "seed_everything": seed, "run.trial": f"{lr}-{seed}"},
                "history": [{"val/acc": v} for v in values]}

    records = {"a0": rec(1, 0, [0.1, 0.9]), "b0": rec(2, 0, [0.1, 0.6]), "c0": rec(3, 0, [0.1, 0.8])}
    a1 = {"model.lr": 1, "seed_everything": 1, "run.trial": "a1"}
    assert hyperband.point_verdict(rule, [0.1, 0.5], "a1", a1, records, "seed_everything") is None
    assert hyperband.verdict(rule, [0.1, 0.5], [[0.1, 0.9], [0.1, 0.6], [0.1, 0.8], [0.1, 0.5]])  # alone: stops
    records["a1"] = rec(1, 1, [0.1, 0.5])  # A's seed 1 has written its record: A's mean is 0.7 for others
    b1 = {"model.lr": 2, "seed_everything": 1}
    reason = hyperband.point_verdict(rule, [0.1, 0.6], "b1", b1, records, "seed_everything")
    assert "its point's mean over seeds" in reason and "threshold 0.7" in reason
    records["b0"]["status"] = "stopped_early"  # a sibling stopped: this seed stops at once, before any bracket
    assert "its point was stopped at seed_everything=0" in hyperband.point_verdict(
        rule, [0.99], "b1", b1, records, "seed_everything")


def test_cli_seeds_per_point_and_confirm(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({**config(tmp_path / "runs", [0], 6), "name": "noisy"}))
    assert cli.main([str(path), "--backend", "local", "--dry-run", "--seeds-per-point", "3", "--confirm", "2,5"]) == 0
    out = capsys.readouterr().out
    assert "each point at 3 seeds (0, 1, 2), the mean told; the top 2 confirmed at 5 seeds" in out
    assert cli.main([str(path), "--backend", "local", "--dry-run", "--confirm", "2,5"]) == 2
    assert "a confirmation stage needs points trained at several seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([str(path), "--confirm", "2"])
    assert "expected M,N" in capsys.readouterr().err
    assert cli.main([str(path), "--backend", "wandb", "--seeds-per-point", "3", "--confirm", "2,5"]) == 2
    assert "--confirm is the local backend's" in capsys.readouterr().err


def test_the_demo_bayes_seeds_profile_confirms_its_top_two_at_five_seeds():
    from vit_lightning.ablation import load
    from vit_lightning.commands.sweep import yamls

    (_, config), *_ = yamls.sweep_configs(load("cls_vs_gap"), "demo_bayes_seeds")
    assert config["parameters"]["seed_everything"] == {"values": [0, 1, 2]} and config["run_cap"] == 24
    assert "confirm" not in config  # no W&B key: read from the profile the sweep names
    assert cli.profile_confirm(config, None) == (2, 5)


def test_the_searched_table_tests_the_confirmed_points_against_the_grids_best_cell(tmp_path):
    """Canned demo_bayes_seeds records (cls/mlp_tanh: two points at 5 seeds, one at 3) against the committed demo grid:
    the confirmed points' rows, Welch's p by scipy and Holm's by hand."""
    from scipy import stats

    from vit_lightning.commands.results import cli as table_cli

    repo_grid = Path(__file__).resolve().parent.parent / "results" / "cls_vs_gap"
    folder = tmp_path / "runs" / "cls_vs_gap" / "demo_bayes_seeds"
    accs = {0.002: [0.95, 0.952, 0.948, 0.951, 0.949], 0.0028: [0.90, 0.91, 0.905, 0.895, 0.90], 0.001: [0.99] * 3}
    for lr, values in accs.items():
        for seed, acc in enumerate(values):
            name = f"p{lr}-s{seed}"
            (folder / name).mkdir(parents=True)
            cfg = {"model.pooling": "cls", "model.head": "mlp_tanh", "model.lr": lr, "seed_everything": seed}
            record = {"name": name, "trial": name, "ablation": "cls_vs_gap", "profile": "demo_bayes_seeds",
                      "status": "completed", "config": cfg, "metrics": {"val/acc_best": acc},
                      "history": [{"epoch": e, "val/acc": acc} for e in range(20)]}
            (folder / name / "results.json").write_text(json.dumps(record))
    out = tmp_path / "out"
    assert table_cli.main(["cls_vs_gap", "--profile", "demo_bayes_seeds", "--runs", str(tmp_path / "runs"), "--out",
                           str(out), "--compare-with", str(repo_grid), "--no-figures"]) == 0
    text = (out / "table.md").read_text()
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.split("## the top 2 points")[1].splitlines()
            if line.startswith("| cls/mlp_tanh")]
    assert [r[1] for r in rows] == ["0.002", "0.0028"]  # the 3-seed point (0.99) is no confirmed point
    grid = [json.loads(p.read_text()) for p in (repo_grid / "records").glob("*.json")]
    cells: dict[float, list[float]] = {}
    for r in grid:
        c = r["config"]
        if r["profile"] == "demo" and (c["model.pooling"], c["model.head"]) == ("cls", "mlp_tanh") and \
                r["status"] == "completed":
            cells.setdefault(c["model.lr"], []).append(r["metrics"]["val/acc_best"])
    best_lr = max(cells, key=lambda lr: sum(cells[lr]) / len(cells[lr]))
    ps = [stats.ttest_ind(accs[lr], cells[best_lr], equal_var=False).pvalue for lr in (0.002, 0.0028)]
    low, high = sorted(ps)
    holm_ = {low: min(1, 2 * low), high: max(min(1, 2 * low), min(1, high))}
    for row, p in zip(rows, ps):
        assert row[3] == f"{best_lr:g}" and row[6] == (f"{p:.3f}" if p >= 0.001 else "<0.001")
        assert row[7] == (f"{holm_[p]:.3f}" if holm_[p] >= 0.001 else "<0.001")
    # the spend table's best is the confirmed point with the best mean at 5 seeds, not the 3-seed one
    spend_table = text.split("## bayes search of ")[1]  # below the verdict grid, whose rows start alike
    spend = next(line for line in spend_table.splitlines() if line.startswith("| cls/mlp_tanh |"))
    assert "| 0.002 " in spend and "0.9500 ± 0.0016 (n=5)" in spend


@pytest.mark.slow  # trains
def test_a_real_replicated_sweep_stops_a_points_seeds_together_and_confirms_the_best(tmp_path, monkeypatch):
    """lr 2e-3 learns, lr 1e-7 does not; each point at seeds 0 and 1, the top 1 confirmed at 3 seeds. With the
    learning point proposed first, the other's seed 0 falls below it at bracket 1 (its point's mean) and stops,
    and its seed 1 never starts; the learning point trains on to seed 2 without the rule."""
    import yaml

    from tests.tiny import tiny_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    fixed = {**tiny_settings(),
             "data.name": "mnist5k", "model.patch_size": 7, "model.pooling": "gap", "model.head": "linear",
             "trainer.max_epochs": 2, "trainer.limit_train_batches": 8, "trainer.limit_val_batches": 4,
             "trainer.devices": 1, "run.root": str(tmp_path / "runs"), "run.ablation": "cls_vs_gap",
             "run.profile": "demo", "run.wandb": "off"}
    config = {"method": "bayes", "metric": {"name": "val/acc_best", "goal": "maximize"}, "run_cap": 4,
              "early_terminate": {"type": "hyperband", "min_iter": 1, "eta": 3},
              "command": ["${env}", "vit-ablate", "fit", "${args}"],
              "parameters": {**{k: {"value": v} for k, v in fixed.items()}, "seed_everything": {"values": [0, 1]},
                             "model.lr": {"values": [0.002, 1e-7]}}}
    # the sweep seed whose first proposal is the learning point (found without training, in a scratch root)
    def first(s: int) -> float:
        root = {"run.root": {"value": str(tmp_path / f"scratch{s}")}}
        return Search({**config, "parameters": {**config["parameters"], **root}}, 4, seed=s).next().params["model.lr"]

    seed = next(s for s in range(20) if first(s) == 0.002)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main([str(path), "--backend", "local", "--seed", str(seed), "--confirm", "1,3"]) == 0
    folder = tmp_path / "runs" / "cls_vs_gap" / "demo"
    recs = [json.loads(p.read_text()) for p in folder.glob("*/results.json")]
    runs = {(r["config"]["model.lr"], r["config"]["seed_everything"]): r for r in recs}
    assert sorted(runs) == [(1e-7, 0), (0.002, 0), (0.002, 1), (0.002, 2)]  # no second seed of the stopped point
    poor = runs[(1e-7, 0)]
    assert poor["status"] == "stopped_early" and "its point's mean over seeds" in poor["stopped_early"]
    assert all(runs[(0.002, s)]["status"] == "completed" for s in range(3))
    assert hyperband.OPTION.replace("run.", "") not in " ".join(
        json.loads((folder / ".sweep-state.json").read_text())["trials"][runs[(0.002, 2)]["trial"]]["command"])


def test_a_bad_confirm_is_refused_where_it_is_written():
    import dataclasses

    from vit_lightning.ablation import load

    prof = load("cls_vs_gap").profile("demo_bayes_seeds")
    for bad in ({"top": 2}, {"top": 0, "seeds": 5}, {"top": 2, "seeds": 2}):
        with pytest.raises(ValueError, match="a search's confirm is"):
            dataclasses.replace(prof, search={**prof.search, "confirm": bad})
    with pytest.raises(ValueError, match="confirm"):
        search.check_confirm((2, 2), 3)  # n below the k seeds a point already has

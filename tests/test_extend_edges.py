"""A selection at the edge of its values is extended, cell by cell, until its best lies inside them: the table says
'interior' or names the next value, and `sweep --extend-edges` trains exactly those values (canned records)."""

from __future__ import annotations

import json
import math

from test_results import ENC, INJ, LR, table, write_run

from vit_lightning.ablation import Ablation, Profile, beyond, load
from vit_lightning.commands.sweep import cli, trials, yamls

SRC = "model.init_from"
GRID = [0.003, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4]  # transfer's demo_select grid


def test_the_next_value_steps_as_the_grid_does_at_that_edge():
    assert beyond([0.1, 0.2, 0.4], upward=True) == 0.8  # doubling
    assert beyond([0.4, 0.1, 0.2], upward=False) == 0.05  # halving, in any order
    assert beyond(GRID, upward=False) == 0.0009  # 0.003 x (0.003 / 0.01), not 0.0009000000000000001
    assert beyond([0.002, 0.0028, 0.004], upward=True) == float(f"{0.004 * 0.004 / 0.0028:.3g}")


def _write(trial, acc: float) -> None:
    trial.run_dir.mkdir(parents=True)
    (trial.run_dir / "results.json").write_text(json.dumps(
        {"name": trial.id, "trial": trial.id, "status": "completed", "metrics": {"val/acc_best": acc}}))


def _selection(root, lrs=None) -> list:
    """The transfer demo's selection trials (at `lrs` instead of the grid, if given) with their runs under root."""
    configs = [c for _, c in yamls.sweep_configs(load("transfer"), "demo_select")]
    for config in configs:
        config["parameters"]["run.root"] = {"value": str(root)}
        if lrs is not None:
            config["parameters"][LR] = {"values": lrs}
    return trials.build(configs)


def _lines(capsys) -> tuple[list[str], list[str]]:
    """(the --extend-edges lines of stderr, the trials' commands of stdout)."""
    out, err = capsys.readouterr()
    return ([line.split("--extend-edges: ", 1)[1] for line in err.splitlines() if "--extend-edges: " in line],
            [line for line in out.splitlines() if not line.startswith("#")])


def test_extend_edges_trains_the_next_value_of_each_edge_cell_only(tmp_path, capsys):
    """none peaks at 0.4 (the largest), learned_2d at 0.003 (the smallest), the rest at 0.03: the sweep trains none at
    0.8 and learned_2d's two cells at 0.0009, nothing else; once those ran, none (still rising) goes on to 1.6 and
    learned_2d is interior; the fine-tuning stage selects from the extended values too."""
    peaks = {"none": 0.8, "learned_2d": 0.002}  # the held-out curve's true peak (others: 0.03)

    def acc(trial) -> float:
        return 0.9 - abs(math.log10(trial.params[LR] / peaks.get(trial.params[ENC], 0.03)))

    argv = ["transfer", "--profile", "demo_select", "--extend-edges", "--dry-run", "--set", f"run.root={tmp_path}"]
    assert cli.main(argv) == 2  # the grid has not run: one line naming the command that runs it
    assert capsys.readouterr().err.strip().endswith("make them first: vit-ablate sweep transfer --profile demo_select")
    for trial in _selection(tmp_path):
        _write(trial, acc(trial))
    assert cli.main(argv) == 0
    said, commands = _lines(capsys)
    assert "none/stem: best model.lr=0.4 is the largest tried: adds 0.8" in said
    assert "learned_2d/every_layer: best model.lr=0.003 is the smallest tried: adds 0.0009" in said
    assert "learned_1d/stem: best model.lr=0.03 is interior (0.003 to 0.4 tried): nothing added" in said
    assert len(said) == 8 and len(commands) == 4  # 8 cells; none/stem and learned_2d's three cells to train
    assert sorted(c.split("--model.lr=")[1].split()[0] for c in commands) == ["0.0009", "0.0009", "0.0009", "0.8"]
    job = [arg for arg in argv if arg != "--dry-run"]
    assert cli.main([*job, "--backend", "local", "--print-sbatch"]) == 0  # a cluster job extends the same way
    assert "--extend-edges" in capsys.readouterr().out

    for trial in _selection(tmp_path, [0.8, 0.0009]):  # the extensions ran (and, harmlessly, other cells' too)
        _write(trial, acc(trial))
    assert cli.main(argv) == 0
    said, commands = _lines(capsys)
    assert "none/stem: best model.lr=0.8 is the largest tried: adds 1.6" in said  # 0.8 is its peak: one more step
    assert "learned_2d/stem: best model.lr=0.003 is interior (0.0009 to 0.8 tried): nothing added" in said
    assert [c.split("--model.lr=")[1].split()[0] for c in commands] == ["1.6"]
    assert "--model.pos_encoding=none " in commands[0]

    assert cli.main(["transfer", "--dry-run", "--set", f"run.root={tmp_path}"]) == 0  # the fine-tuning stage
    tuned = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    for line in tuned:
        encoding = line.split("--model.pos_encoding=")[1].split()[0]
        assert f"--model.lr={ {'none': 0.8, 'learned_2d': 0.003}.get(encoding, 0.03)} " in line


def test_extend_edges_refuses_a_stage_nothing_selects_from(tmp_path, capsys):
    assert cli.main(["transfer", "--profile", "demo", "--extend-edges", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vit-ablate sweep: error: --extend-edges: profile 'demo' of transfer is no selection stage")
    assert "demo_select" in err and "\n" not in err


def test_the_table_says_interior_or_names_the_next_value_past_the_edge(tmp_path):
    """Every value of the stage's grid ran: none peaks inside it (interior), learned_1d at its largest (censored,
    and the next value, 0.06 doubled, with the command that trains it)."""
    grids = ({ENC: ["none"], INJ: ["stem"], SRC: ["a"]}, {ENC: ["learned_1d"], INJ: ["stem"], SRC: ["c"]})
    fixed = {"data.name": "mnist5k", "trainer.max_epochs": 3}
    profiles = {"demo": Profile("demo", {**fixed, LR: "select:demo_select"}, grids, (0,)),
                "demo_select": Profile("demo_select", fixed, tuple({**g, LR: [0.015, 0.03, 0.06]} for g in grids), (0,))}
    ab = Ablation("transfer", "t", "s", "f", "val/acc_best", ENC, INJ, {}, "", profiles, replicates=SRC)
    curves = {"none": {0.015: 0.5, 0.03: 0.7, 0.06: 0.6}, "learned_1d": {0.015: 0.5, 0.03: 0.6, 0.06: 0.8}}
    for enc, source in (("none", "a"), ("learned_1d", "c")):
        write_run(tmp_path / "runs", ab, {ENC: enc, INJ: "stem", SRC: source}, 0, 0.8,
                  **{LR: max(curves[enc], key=curves[enc].get)})
        for lr, acc in curves[enc].items():
            write_run(tmp_path / "runs", ab, {ENC: enc, INJ: "stem", SRC: source, LR: lr}, 0, acc, profile="demo_select")
    _, md = table(ab, tmp_path)
    assert "none/stem 0.03 (0.015: 0.500, 0.03: 0.700, 0.06: 0.600), interior; " in md
    assert "learned_1d/stem 0.06 (0.015: 0.500, 0.03: 0.600, 0.06: 0.800), censored (the largest tried)" in md
    assert ("censored in 1 of 2 cells" in md and "next past each edge (learned_1d/stem 0.12): `vit-ablate sweep "
            "transfer --profile demo_select --extend-edges` trains them, then this stage again") in md
    assert "also lists" not in md  # nothing of the grid is left to run

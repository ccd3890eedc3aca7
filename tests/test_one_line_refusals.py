"""Options that cannot do what they say are one line before anything is written: `docs --out FILE`,
`--trials-per-gpu` without a GPU; and a fit's hyperband rule is judged against its own sweep only."""

from __future__ import annotations

import json

from vit_lightning.commands.docs import pages as docs
from vit_lightning.commands.sweep import cli
from vit_lightning.run.hyperband import OPTION, sweep_histories


def test_docs_out_a_file_is_one_line_and_leaves_it_alone(tmp_path, capsys):
    target = tmp_path / "page.md"
    target.write_text("mine")
    assert docs.main(["--out", str(target)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"vit-ablate docs: error: --out {target} is a file; give a folder (the pages are written into it)"
    assert target.read_text() == "mine"
    assert docs.main(["--out", str(target / "sub")]) == 2  # a file where a parent folder should be
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("vit-ablate docs: error: cannot write the pages into --out: ") and "Not a directory" in line


def test_trials_per_gpu_without_a_gpu_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible: N slots would share nothing
    for extra in (["--dry-run"], ["--backend", "local"]):
        argv = ["pos_encoding", "--trials-per-gpu", "3", "--set", f"run.root={tmp_path / 'runs'}", *extra]
        assert cli.main(argv) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line == ("vit-ablate sweep: error: --trials-per-gpu 3: no GPU is visible here (CUDA_VISIBLE_DEVICES, "
                        "torch); on the CPU use --parallel 3 to run that many trials at once")
    assert not (tmp_path / "runs").exists()


def write_record(folder, name, accs, rule=None, keep_key=True):
    (folder / name).mkdir()
    config = {"model.pooling": "cls", **({OPTION: rule} if keep_key else {})}
    record = {"config": config, "history": [{"val/acc": a} for a in accs]}
    (folder / name / "results.json").write_text(json.dumps(record))


def test_a_rule_counts_only_the_runs_that_carry_it(tmp_path):
    setting = {"rule": {"type": "hyperband", "min_iter": 1}, "metric": {"name": "val/acc", "goal": "maximize"},
               "fixed": {}}
    same = json.dumps(setting, indent=1)  # another spelling of the same JSON
    other = json.dumps({**setting, "fixed": {"model.pooling": "cls"}})
    write_record(tmp_path, "mine", [0.5], same)
    write_record(tmp_path, "plain_fit", [0.9], None)  # an unrelated run in the folder, trained without a rule
    write_record(tmp_path, "other_sweep", [0.8], other)
    write_record(tmp_path, "before_rules_were_kept", [0.7], keep_key=False)
    assert sweep_histories(tmp_path, {}, "val/acc", setting) == {"mine": [0.5], "before_rules_were_kept": [0.7]}
    assert set(sweep_histories(tmp_path, {}, "val/acc")) == {"mine", "plain_fit", "other_sweep", "before_rules_were_kept"}

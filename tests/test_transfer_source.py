"""One owner for `model.init_from`: a source is read once, named by what it is (not how its path is spelled),
checked against its own config before anything is written, and never served stale."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny import TINY_MODEL

from vit_lightning.commands.fit import main as train
from vit_lightning.run.transfer import read_source

TINY = [*TINY_MODEL, "--data.batch_size=32", "--trainer.max_epochs=1", "--trainer.limit_val_batches=2",
        "--run.wandb=off", "--run.fewshot_shots=[]"]


def fit(root, *argv) -> int:
    return train.main([*TINY, f"--run.root={root}", *argv])


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    """A finished tiny run (2 steps), made once for the tests that only read it."""
    root = tmp_path_factory.mktemp("src")
    assert fit(root, "--trainer.limit_train_batches=2", "--run.trial=src") == 0
    return root / "adhoc/local/src"


def _wrong_shape(ckpt: dict) -> None:
    key = next(k for k in ckpt["state_dict"] if k.startswith("model.pos."))
    ckpt["state_dict"][key] = torch.zeros(ckpt["state_dict"][key].shape[0] + 1, *ckpt["state_dict"][key].shape[1:])


def _extra_key(ckpt: dict) -> None:
    ckpt["state_dict"]["model.stray.weight"] = torch.zeros(3)


def _missing_key(ckpt: dict) -> None:
    del ckpt["state_dict"]["model.head.weight"]


def _other_encoding(ckpt: dict) -> None:
    assert ckpt["hyper_parameters"].get("pos_encoding") in (None, "learned_1d")  # the weights hold a 1-D table
    ckpt["hyper_parameters"]["pos_encoding"] = "relative_bias_2d"


@pytest.mark.slow
@pytest.mark.parametrize("mutate,mismatch", [
    (_wrong_shape, "in the weights, "), (_extra_key, "model.stray.weight"[len("model."):]),
    (_missing_key, "head.weight is missing"), (_other_encoding, "pos."),
])
def test_weights_that_do_not_fit_their_config_are_one_line_before_anything_is_written(
        source_run, tmp_path, capsys, mutate, mismatch):
    ckpt = torch.load(source_run / "last.ckpt", map_location="cpu", weights_only=True)
    mutate(ckpt)
    torch.save(ckpt, tmp_path / "bad.ckpt")
    capsys.readouterr()
    assert fit(tmp_path, f"--model.init_from={tmp_path / 'bad.ckpt'}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its weights do not fit its config (" in err[0] and mismatch in err[0], err
    assert [p.name for p in tmp_path.iterdir()] == ["bad.ckpt"]  # no run directory


@pytest.mark.slow
def test_spellings_of_one_source_are_one_run_and_a_changed_source_is_said(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert fit("runs", "--trainer.limit_train_batches=2", "--run.trial=x") == 0
    ft = ["--trainer.limit_train_batches=2", "--data.img_size=56"]
    assert fit("out", "--model.init_from=runs/adhoc/local/x", *ft) == 0
    capsys.readouterr()
    for spelling in (tmp_path / "runs/adhoc/local/x", "runs/../runs/adhoc/local/x", "runs/adhoc/local/x/last.ckpt"):
        assert fit("out", f"--model.init_from={spelling}", *ft) == 0
        captured = capsys.readouterr()
        assert "skipped, run already completed" in captured.out and captured.err == "", (spelling, captured)
    assert len(list((tmp_path / "out/adhoc/local").iterdir())) == 1
    # the source trained again in place (another budget, the same name): said in one line, not trained
    assert fit("runs", "--trainer.limit_train_batches=3", "--run.trial=x", "--run.retrain=true") == 0
    capsys.readouterr()
    assert fit("out", "--model.init_from=runs/adhoc/local/x", *ft) == 0
    captured = capsys.readouterr()
    assert "skipped" in captured.out and len(captured.err.strip().splitlines()) == 1, captured
    assert "changed since this run finished" in captured.err and "--run.retrain=true" in captured.err
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("results.json")]
    assert fit("out", "--model.init_from=runs/adhoc/local/x", *ft, "--run.retrain=true") == 0
    (again,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("results.json")]
    assert again["init_from"]["sha256"] != record["init_from"]["sha256"]
    assert again["init_from"]["sha256"] == read_source("runs/adhoc/local/x").account["sha256"]


@pytest.mark.slow
def test_a_source_retrained_in_the_same_process_is_read_anew(source_run, tmp_path):
    run = tmp_path / "adhoc/local/src"
    shutil.copytree(source_run, run)
    before = read_source(str(run))
    assert fit(tmp_path, "--trainer.limit_train_batches=3", "--run.trial=src", "--run.retrain=true") == 0
    after = read_source(str(run))
    assert after.account["sha256"] != before.account["sha256"]
    changed = [k for k in before.state if not torch.equal(before.state[k], after.state[k])]
    assert changed  # the new weights, not the ones read first
    assert after.id == before.id == "trial:src"  # the same run, trained again


@pytest.mark.slow
def test_a_fit_reads_its_source_once_and_its_module_loads_that_reading(source_run, tmp_path, monkeypatch):
    """init_from is resolved once per fit: fit's checks, its record and the module's weights come from one reading."""
    from vit_lightning.run import transfer

    reads, loaded = [], []
    real_read, real_load = transfer._run_source, transfer.start_from
    monkeypatch.setattr(transfer, "_run_source", lambda text: reads.append(real_read(text)) or reads[-1])
    monkeypatch.setattr(transfer, "start_from", lambda vit, source, *a: loaded.append(source) or real_load(vit, source, *a))
    assert fit(tmp_path, f"--model.init_from={source_run}", "--trainer.limit_train_batches=1") == 0
    assert len(reads) == 1 and len(loaded) == 1 and loaded[0] is reads[0]
    (record,) = [json.loads(p.read_text()) for p in tmp_path.rglob("results.json")]
    assert record["init_from"]["sha256"] == transfer.sha256(source_run / "last.ckpt")


def _finished_source(path, **options):
    """A run directory holding a checkpoint of a ViT of `options` and a completed record (no training)."""
    from vit_lightning.run.module import Classifier

    path.mkdir(parents=True)
    model = Classifier(**{"variant": "micro", "patch_size": 7, "img_size": 28, "in_chans": 1, "num_classes": 10,
                             **options})
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path / "last.ckpt")
    (path / "results.json").write_text(json.dumps({"status": "completed", "trial": path.name, "metrics": {}}))
    return path


def test_the_sweep_checks_a_transfer_trial_with_the_sources_architecture(tmp_path):
    from vit_lightning.commands.sweep.validate import SweepError, check_trial

    src = _finished_source(tmp_path / "src", width=32, heads=2, pos_encoding="relative_bias_2d")
    check_trial([f"--model.init_from={src}", "--data.img_size=56"])  # adopts width 32, heads 2, the source's encoding
    with pytest.raises(SweepError, match=r"model.pos_encoding='none' \(the source has 'relative_bias_2d'\)"):
        check_trial([f"--model.init_from={src}", "--model.pos_encoding=none"])  # fit refuses it: so does the sweep
    check_trial(["--data.img_size=35"])  # from scratch: the demo's patch 7 divides 35
    patch4 = _finished_source(tmp_path / "patch4", patch_size=4)
    with pytest.raises(SweepError, match="35"):
        check_trial([f"--model.init_from={patch4}", "--data.img_size=35"])  # the source's patch 4 does not


def test_missing_sources_follow_fits_rule(tmp_path):
    from vit_lightning.commands.sweep import trials

    done = _finished_source(tmp_path / "runs/a/p/done")
    no_ckpt = tmp_path / "runs/a/p/no_ckpt"
    no_ckpt.mkdir()
    (no_ckpt / "results.json").write_text(json.dumps({"status": "completed", "trial": "no_ckpt"}))
    configs = [{"method": "grid", "parameters": {"model.init_from": {"values": [str(done), str(no_ckpt)]}}}]
    line = trials.missing_sources(trials.build(configs))
    assert line is not None and "no_ckpt" in line and "done" not in line.split(":", 1)[1].split("make")[0]


def test_a_sweep_trial_is_named_by_its_source_not_by_how_the_path_is_spelled(tmp_path, monkeypatch):
    from vit_lightning.commands.sweep import trials

    monkeypatch.chdir(tmp_path)
    spellings = ["runs/pos/demo/src-1", str(tmp_path / "runs/pos/demo/src-1"), "runs/pos/../pos/demo/src-1"]
    names = {trials.make({}, {"model.init_from": text, "data.img_size": 56}).id for text in spellings}
    assert len(names) == 1  # one trial, whether or not the source exists yet
    other = trials.make({}, {"model.init_from": "runs/pos/demo/src-2", "data.img_size": 56}).id
    assert other not in names and names.pop().startswith("ft-")

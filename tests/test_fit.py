"""`vit-ablate fit`: every model option trains for a step on mnist5k; bad options fail in one line, writing nothing."""

import json

import pytest
import yaml
from tiny import TINY_MODEL

from vit_lightning.commands.fit import cli as fitcli
from vit_lightning.commands.fit import main as train

pytestmark = pytest.mark.slow  # every test here trains or starts processes that do

# A one-block model, one train and one val batch: each fit takes about a second on CPU.
TINY = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"]

OPTIONS = {
    **{f"pos-{p}": [f"--model.pos_encoding={p}"]
       for p in ("none", "learned_1d", "learned_2d", "sincos_2d", "relative_1d", "relative_bias_2d", "rope_axial",
                 "rope_mixed", "learned_1d+rope_axial", "learned_1d+rope_mixed")},
    "rope-options": ["--model.pos_encoding=rope_mixed", "--model.rope_theta=100.0", "--model.rope_coords=normalized",
                     "--model.reg_tokens=1"],
    **{f"inject-{p}-{i}": [f"--model.pos_encoding={p}", f"--model.pos_injection={i}"]
       for p, i in [("learned_1d", "every_layer"), ("learned_1d", "every_layer_shared"),
                    ("learned_2d", "every_layer"), ("learned_2d", "every_layer_shared"),
                    ("sincos_2d", "every_layer_shared")]},
    "pos-alibi_2d": ["--model.pos_encoding=alibi_2d"],
    **{f"pos-peg-{i}": ["--model.pos_encoding=peg", f"--model.pos_injection={i}", "--model.depth=2"]  # acts after block 0
       for i in ("stem", "every_layer")},
    "pool-gap": ["--model.pooling=gap", "--model.lr=0.0003"],
    "pool-map": ["--model.pooling=map"],
    "head-mlp_tanh": ["--model.head=mlp_tanh"],
    "hybrid": ["--model.stem=hybrid", "--model.hybrid_layers=[1,1]", "--model.hybrid_width=32"],
    "patch-4": ["--model.patch_size=4"],
    "patch-14": ["--model.patch_size=14"],
    "sgd": ["--model.optimizer=sgd", "--model.lr=0.1", "--model.momentum=0.9"],
    "adamw-linear": ["--model.optimizer=adamw", "--model.schedule=linear", "--model.warmup_epochs=0"],
    "constant": ["--model.schedule=constant", "--model.weight_decay=0"],
    "soft-targets": ["--data.mixup_alpha=0.2", "--data.cutmix_alpha=1.0", "--model.label_smoothing=0.1",
                     "--data.random_crop=True"],
    "two-batches": ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2", "--model.dropout=0.1"],
}


def records(root):
    return sorted(root.glob("*/*/*/results.json"))


@pytest.mark.parametrize("extra", OPTIONS.values(), ids=OPTIONS.keys())
def test_every_option_fits(extra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, *extra, f"--run.root={tmp_path / 'runs'}"]) == 0
    [path] = records(tmp_path / "runs")
    record = json.loads(path.read_text())
    assert record["status"] == "completed", record["error"]
    assert 0.0 <= record["metrics"]["val/acc"] <= record["metrics"]["val/acc5"] <= 1.0
    for arg in extra:  # every option given lands in the record, under its CLI key
        key, value = arg[2:].split("=", 1)
        assert record["config"][key] == yaml.safe_load(value), key
    assert record["config"]["model.num_classes"] == 10 and record["config"]["model.in_chans"] == 1
    assert record["compute"]["gflops_per_image"] > 0 and record["compute"]["params"] > 0
    assert {"metrics.csv", "last.ckpt", "config.yaml"} <= {p.name for p in path.parent.iterdir()}


def test_record_layout_and_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [*TINY, "--model.pos_encoding=learned_2d", "--run.ablation=pos_encoding", "--run.profile=demo",
            "--seed_everything=3"]
    assert train.main(argv) == 0  # default run.root is ./runs
    [path] = records(tmp_path / "runs")
    assert path.parent.parent == tmp_path / "runs" / "pos_encoding" / "demo"
    assert path.parent.name.startswith("mnist5k-micro-p7-learned_2d-stem-cls-lr0.002-s3-")
    record = json.loads(path.read_text())
    assert (record["ablation"], record["profile"], record["config"]["seed_everything"]) == ("pos_encoding", "demo", 3)
    assert set(record) >= {"schema", "name", "status", "config", "metrics", "history", "compute", "versions",
                           "wandb", "error", "started_at", "finished_at", "naming"}
    assert record["naming"] == 1  # the rule that named it (fit's run.naming)
    assert set(record["compute"]) >= {"params", "gflops_per_image", "train_images_per_s", "wall_s", "device",
                                      "num_devices", "precision"}
    assert record["compute"]["precision"] == "32-true" and record["wandb"] is None


def test_every_backbone_option_is_a_model_option_with_its_default():
    import dataclasses
    import inspect

    from vit_lightning.commands.sweep.validate import fit_parser
    from vit_lightning.core.defaults import DEMO
    from vit_lightning.model import ModelConfig
    from vit_lightning.model.family import family_options
    from vit_lightning.run.module import Classifier

    defaults = fit_parser().get_defaults()
    fields = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    fields.update({name: option.default for name, option in family_options().items()})  # each family's own
    for name, default in fields.items():
        key = f"model.{name}"
        if name in fitcli.LINKED:  # set from the data, not an option
            assert key not in defaults
        else:
            assert defaults[key] == DEMO.get(key, default), key  # the demo's value where it sets one
    own = [p for p in inspect.signature(Classifier).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    model_keys = {k[len("model."):] for k in defaults.keys() if k.startswith("model.")}
    assert model_keys == (set(fields) - set(fitcli.LINKED)) | {p.name for p in own}  # nothing else under model.*
    assert all(defaults[f"model.{p.name}"] == DEMO.get(f"model.{p.name}", p.default) for p in own)


def test_config_files_and_print_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text("model:\n  pos_encoding: sincos_2d\n  pooling: gap\n")
    (tmp_path / "b.yaml").write_text("model:\n  pooling: cls\ntrainer:\n  max_epochs: 1\n")
    argv = ["--config=a.yaml", "--config", "b.yaml", *TINY]
    assert train.main([*argv, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["pos_encoding"] == "sincos_2d" and printed["model"]["pooling"] == "cls"
    assert "run" in printed and not (tmp_path / "runs").exists()
    assert train.main(argv) == 0
    [path] = records(tmp_path / "runs")
    config = json.loads(path.read_text())["config"]
    assert (config["model.pos_encoding"], config["model.pooling"]) == ("sincos_2d", "cls")


BAD = {
    "unknown-pos": (["--model.pos_encoding=bogus"], "pos_encoding"),
    "disallowed": (["--model.pos_encoding=relative_1d", "--model.pos_injection=every_layer"], "pos_injection"),
    "shape": (["--model.patch_size=5"], "patch_size"),
    "heads": (["--model.heads=3"], "heads"),
    "rope-theta": (["--model.pos_encoding=rope_axial", "--model.rope_theta=0"], "rope_theta"),
    "rope-alone": (["--model.rope_coords=ref_grid"], "rope_coords"),
    "data": (["--data.name=nope"], "data.name"),
    "optimizer": (["--model.optimizer=adam"], "optimizer"),
    "schedule": (["--model.schedule=step"], "schedule"),
    "unknown-key": (["--model.colour=red"], "colour"),
    "bad-type": (["--model.lr=fast"], "model.lr"),
    "wandb-mode": (["--run.wandb=maybe"], "run.wandb"),
}


@pytest.mark.parametrize("extra,mentions", BAD.values(), ids=BAD.keys())
def test_bad_options_fail_in_one_line_before_writing(extra, mentions, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vit-ablate fit: error:") and mentions in err[0], err
    assert list(tmp_path.iterdir()) == []  # no run dir, no logs


def test_dispatcher_runs_fit(tmp_path, monkeypatch):
    from vit_lightning import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["fit", *TINY, "--model.pos_encoding=none"]) == 0
    assert len(records(tmp_path / "runs")) == 1


def test_gflops_are_multiply_adds_including_attention():
    from vit_lightning.model import ViT
    from vit_lightning.run.record import gflops_per_image

    # DeiT / timm tables: ViT-Ti/16 at 224 is 1.3 GFLOPs (one multiply-add = one FLOP, attention included).
    assert 1.2 < gflops_per_image(ViT("Ti", img_size=224, patch_size=16), 3, 224) < 1.3
    tiny = ViT("micro", img_size=28, in_chans=1, num_classes=10, patch_size=4)  # 50 tokens, D=64, 4 blocks
    per_block = 50 * 64 * 3 * 64 + 50 * 64 * 64 + 2 * 50 * 64 * 256 + 2 * 50 * 50 * 64
    expected = 4 * per_block + 49 * 16 * 64 + 64 * 10
    assert gflops_per_image(tiny, 1, 28) * 1e9 == pytest.approx(expected, rel=0.01)

"""Each family declares the shared options it reads: one it reads changes its model, one it does not read is refused in
one line before anything is built or written; families outside the tree enter through an entry point."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields, replace

import conv_family
import pytest
import torch
import yaml

from vit_lightning.model import ENCODINGS, FAMILIES, POOLINGS, ModelConfig, build_backbone
from vit_lightning.model.config import CONTRACT_OPTIONS, SharedOptions
from vit_lightning.model.family import ENTRY_POINTS, Registry, discover
from vit_lightning.model.layers import INITS

ARCHS = [*FAMILIES, conv_family.NAME]  # the package's families and the test family (the `conv` fixture registers it)
SHARED = [f.name for f in fields(SharedOptions) if f.name not in CONTRACT_OPTIONS]
ENCODING_NAMES = tuple(dict.fromkeys([*ENCODINGS, *(e for f in FAMILIES.values() for e in f.encodings)]))
# values away from every family's default for each shared option a family may declare (a test fails on a new one)
CHANGED = {"patch_size": (2, 4, 14), "width": (16, 48), "pos_encoding": ENCODING_NAMES, "pooling": tuple(POOLINGS),
           "head": ("mlp_tanh",), "dropout": (0.5,), "attn_dropout": (0.5,), "drop_path": (0.5,), "init": INITS,
           "layer_scale": (0.1,), "qk_norm": (True,)}
SHAPE = {"img_size": 28, "in_chans": 1, "num_classes": 5}


def test_every_shared_option_beyond_the_contract_has_changed_values_here():
    assert set(CHANGED) == set(SHARED)


def _family(arch: str, request):
    if arch == conv_family.NAME:
        request.getfixturevalue("conv")
    return FAMILIES[arch]


def _built(options: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_backbone(variant="micro", **options)


def _changes(base: torch.nn.Module, other: torch.nn.Module) -> bool:
    """The two models differ: in their parameters' shapes, or (the same shapes, the same seed) in what a training
    step's forward computes."""
    if {k: v.shape for k, v in base.state_dict().items()} != {k: v.shape for k, v in other.state_dict().items()}:
        return True
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    outs = []
    for model in (base.train(), other.train()):
        torch.manual_seed(1)
        outs.append(model.forward_features(x))
    return not torch.allclose(*outs)


@pytest.mark.parametrize("option", SHARED)
@pytest.mark.parametrize("arch", ARCHS)
def test_a_shared_option_a_family_reads_changes_its_model_and_one_it_does_not_read_is_refused(arch, option, request):
    family = _family(arch, request)
    base = {"arch": arch, **SHAPE, **({"patch_size": family.demo_patch} if "patch_size" in family.reads else {})}
    default = family.defaults.get(option, next(f.default for f in fields(SharedOptions) if f.name == option))
    values = [v for v in CHANGED[option] if v not in (default, base.get(option))]
    if option in family.reads:
        baseline, accepted = _built(base), []
        for value in values:
            try:
                accepted.append((value, _built({**base, option: value})))
            except ValueError as error:  # another rule (a patch size the image does not take, ...)
                assert "is not read by" not in str(error)
        assert accepted, f"arch={arch} declares it reads {option} but accepts none of {values}"
        assert [value for value, model in accepted if not _changes(baseline, model)] == []
        return
    reads = {f"model.{name}" for name in family.reads} | {f"model.{name}" for name in family.options}
    for value in values:  # refused where the options are read, before a model is built
        with pytest.raises(ValueError) as refused:
            ModelConfig(**base, **{option: value})
        line = str(refused.value)
        pattern = rf"model\.{option}={re.escape(repr(value))} is not read by arch={arch}; it reads: (.*)"
        match = re.fullmatch(pattern, line)
        assert match and set(match.group(1).split(", ")) == reads, line


def test_a_declaration_of_an_unknown_shared_option_is_refused(conv):
    FAMILIES.entries[conv.name] = replace(conv, reads=conv.reads | {"depth"})  # the fixture unregisters it after
    with pytest.raises(ValueError, match=r"^arch=conv declares it reads depth, not shared options beyond the "
                                         r"contract's; choose from: patch_size, width, .*qk_norm$"):
        ModelConfig(arch="conv")


CONV_REFUSED = ("model.qk_norm=True is not read by arch=conv; it reads: model.patch_size, model.width, model.head, "
                "model.init, model.kernel_size")


def test_the_conv_family_given_qk_norm_refuses_in_one_line_in_fit_and_in_a_sweeps_check(conv, tmp_path, capsys,
                                                                                         monkeypatch):
    """fit stops before its run directory exists; a sweep's check before its first trial starts."""
    from vit_lightning.commands.fit import main as train
    from vit_lightning.commands.sweep import cli as sweep_cli

    monkeypatch.chdir(tmp_path)
    argv = ["--model.arch=conv", "--model.qk_norm=true", "--trainer.max_epochs=1", "--run.wandb=off", "--run.root=runs"]
    assert train.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [f"vit-ablate fit: error: {CONV_REFUSED}"]
    params = {a[2:].split("=", 1)[0]: {"value": yaml.safe_load(a.split("=", 1)[1])} for a in argv}
    params.update({"run.wandb": {"value": "off"}, "seed_everything": {"values": [0]}})
    sweep = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"}, "parameters": params,
             "command": ["${env}", "vit-ablate", "fit", "${args}"]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    assert sweep_cli.main(["s.yaml", "--backend", "local"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and CONV_REFUSED in err[0], err
    assert not (tmp_path / "runs").exists()


def _site(tmp_path, entry: str, name: str = "broken_family-0.1"):
    return conv_family.install(tmp_path / "site", entry=entry, name=name)


@pytest.mark.parametrize(("entry", "why"), [
    ("broken = no_such_module:CONV", "does not load: ModuleNotFoundError: No module named 'no_such_module'"),
    ("broken = conv_family:NO_SUCH", "does not load: AttributeError: module 'conv_family' has no attribute 'NO_SUCH'"),
    ("broken = conv_family:CONV_VARIANTS", "names a dict, not a vit_lightning.model.family.Family"),
    ("broken = conv_family:CONV", "names the family arch=conv; an entry point's name is its family's arch"),
    ("vit = conv_family:CONV", "arch=vit is registered already, by vit_lightning.model.vit"),
])
def test_a_bad_entry_point_is_one_line_naming_it_on_every_read(entry, why, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_site(tmp_path, entry)))
    registry = Registry()
    registry.entries.update(FAMILIES.entries)  # the package's own families, registered by their modules
    line = f"entry point {entry} (group {ENTRY_POINTS}, distribution broken_family) {why}"
    if why.startswith("arch="):
        line = line.replace(") arch=", "): arch=")
    for _ in range(2):  # not loaded, so still an error at the next read
        with pytest.raises(ValueError) as bad:
            list(registry)
        assert str(bad.value) == line
    assert set(registry.entries) == set(FAMILIES.entries)


def test_a_family_of_an_entry_point_is_registered_at_the_registrys_first_read_once(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(conv_family.install(tmp_path / "site")))
    registry = Registry()
    registry.entries.update(FAMILIES.entries)
    assert list(registry) == [*FAMILIES, conv_family.NAME] and registry[conv_family.NAME] is conv_family.CONV
    assert discover(registry=registry) == []  # registered already, by the same entry point


@pytest.mark.slow  # starts a process
def test_a_command_with_a_bad_entry_point_installed_says_so_in_one_line(tmp_path):
    env = {"PYTHONPATH": str(_site(tmp_path, "broken = no_such_module:CONV"))}
    done = subprocess.run([sys.executable, "-m", "vit_lightning.cli", "table", "pos_encoding"], capture_output=True,
                          text=True, env={**__import__("os").environ, **env}, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"vit-ablate: error: entry point broken = no_such_module:CONV (group {ENTRY_POINTS}, distribution "
        "broken_family) does not load: ModuleNotFoundError: No module named 'no_such_module'"], done.stderr
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir())) == '["site"]'  # nothing written


@pytest.mark.parametrize(("old", "new"), [("vit_lightning.model.config.ViTConfig", "vit_lightning.model.ModelConfig"),
                                          ("vit_lightning.run.module.ViTClassifier", "vit_lightning.run.module.Classifier"),
                                          ("vit_lightning.data.datamodule.ViTDataModule",
                                           "vit_lightning.data.datamodule.ImageDataModule")])
def test_the_earlier_names_are_the_same_classes_by_their_class_paths(old, new):
    """A class path saved in a config or written in a script (`class_path: ...ViTClassifier`) still resolves."""
    from jsonargparse.typing import import_object

    assert import_object(old) is import_object(new)
    assert import_object(new).__name__ == new.rsplit(".", 1)[1]

"""Every backbone family meets one contract; a third family (a convolutional one) enters through an entry point."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import vit_lightning
from vit_lightning.model import FAMILIES, Backbone, ModelConfig, build_backbone
from vit_lightning.model.family import (
    ATTENTION_MAPS,
    CAPABILITIES,
    PRE_LOGITS,
    RESIZE,
    TOKEN_GRID,
    Unsupported,
)


def _build(arch: str, head: str = "linear") -> nn.Module:
    family = FAMILIES[arch]
    torch.manual_seed(0)
    return build_backbone(arch=arch, variant="micro", img_size=28, in_chans=1, num_classes=5,
                          patch_size=family.demo_patch, head=head)


def _contract(arch: str) -> None:
    """Shapes, no NaN, a gradient for every parameter, the shared methods, then each capability the family offers."""
    model = _build(arch)
    assert isinstance(model, Backbone) and model.config.arch == arch
    x = torch.randn(3, 1, 28, 28)
    feats, logits = model.forward_features(x), model(x)
    assert feats.ndim == 2 and feats.shape[0] == 3 and logits.shape == (3, 5)
    assert torch.isfinite(feats).all() and torch.isfinite(logits).all()
    for module in model.head.modules():  # the zero classifier would stop every gradient behind it
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight)
    model.train()
    model(x).square().sum().backward()
    names = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert names == [], names
    own = {id(p): p.numel() for m in model.modules() for p in m._parameters.values() if p is not None}
    assert model.num_params() == sum(own.values())
    assert model.no_weight_decay() <= {n for n, _ in model.named_parameters()}
    model.eval()
    family = FAMILIES[arch]
    for capability in CAPABILITIES:  # what a family lacks is one line naming it and what needed it
        line = family.lacks(capability, "this figure")
        assert (line is None) == (capability in family.offers)
        if line is not None:
            assert line == f"arch={arch} does not offer {CAPABILITIES[capability]}, needed by this figure"
            with pytest.raises(Unsupported, match=f"^{line}$"):
                family.require(capability, "this figure")
    if ATTENTION_MAPS in family.offers:
        maps = model.attention_maps(x)
        assert maps and all(torch.allclose(m.sum(-1), torch.ones(())) for m in maps)
    if TOKEN_GRID in family.offers:  # the image cut into patch_size patches
        p = model.config.patch_size
        assert model.stem.grid_for((28, 28)) == (28 // p, 28 // p)
    if RESIZE in family.offers:  # a new size runs at that size; back again, the same shapes; the same size, the same
        shapes = {k: v.shape for k, v in model.state_dict().items()}
        before = model(x)
        model.resize(28)
        assert torch.allclose(model(x), before, atol=1e-5)
        model.resize(42)
        assert model(torch.randn(2, 1, 42, 42)).shape == (2, 5)
        model.resize(28)
        assert {k: v.shape for k, v in model.state_dict().items()} == shapes and model.config.img_size == 28
    if PRE_LOGITS in family.offers:  # the head's hidden layer when it has one (what a few-shot probe reads)
        mlp = _build(arch, head="mlp_tanh").eval()
        rep = mlp.pre_logits(x)
        assert rep.shape == feats.shape and torch.allclose(mlp.head[-1](rep), mlp(x), atol=1e-6)
        assert torch.allclose(rep, mlp.head[:-1](mlp.forward_features(x)))
        assert torch.equal(model.pre_logits(x), model.forward_features(x))  # a linear head: the pooled features


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_every_family_meets_the_contract(arch):
    _contract(arch)


def test_a_convolutional_family_meets_the_contract_from_its_entry_alone(conv):
    _contract("conv")
    model = _build("conv")
    assert vit_lightning.model.family.family_of(model) is conv
    assert not any(isinstance(m, nn.MultiheadAttention) or hasattr(m, "attn") for m in model.modules())
    assert not hasattr(model, "attention_maps") and not hasattr(model, "resize")


def test_a_family_declares_and_checks_its_own_options(conv):
    """Its options reach its config by their public names, its check refuses a bad value in one line, and
    fit's parser offers them with their help; other families refuse them away from their default."""
    from vit_lightning.commands.fit.cli import fit_parser

    assert build_backbone(arch="conv", kernel_size=5, img_size=28, in_chans=1, num_classes=3).blocks[0].depthwise \
        .kernel_size == (5, 5)
    with pytest.raises(ValueError, match="^kernel_size must be an odd number of pixels, got 4$"):
        ModelConfig(arch="conv", kernel_size=4)
    with pytest.raises(ValueError, match="^model.kernel_size=5 applies to arch=conv only, not arch=vit$"):
        ModelConfig(kernel_size=5)
    assert ModelConfig(kernel_size=3).to_dict().get("kernel_size") is None  # its default: not another family's option
    defaults = fit_parser().get_defaults()
    assert defaults["model.kernel_size"] == 3 and defaults["model.window_size"] == 7  # the Swin's, declared by it


def test_an_option_another_family_reads_is_refused_by_one_rule(conv):
    """Each family's own options, away from their defaults, are refused for every other family, in one line."""
    for arch, family in FAMILIES.items():
        for other in FAMILIES.values():
            for name, unused in {k: o.default for k, o in other.options.items()}.items():
                if name in family.options:
                    continue
                changed = 3 if unused is None else (not unused if isinstance(unused, bool) else
                                                    "timm" if isinstance(unused, str) and name == "init" else
                                                    "hybrid" if isinstance(unused, str) else
                                                    (2, 2) if isinstance(unused, tuple) else unused + 32)
                with pytest.raises(ValueError, match=f"model.{name}=.* applies to arch={other.name} only, "
                                                     f"not arch={arch}"):
                    ModelConfig(arch=arch, **{name: changed})


def test_no_package_file_outside_model_names_a_family():
    """Family names and classes live in model/ only: a family's figures module asks its family for its words."""
    root = Path(vit_lightning.__file__).parent
    named = []
    for path in root.rglob("*.py"):
        if root / "model" in path.parents:
            continue
        text = path.read_text()
        named += [f"{path.relative_to(root)}: {arch}" for arch, family in FAMILIES.items()
                  if arch != "vit" and arch in text.lower()]
    assert named == []


def test_a_family_says_how_its_figures_title_a_run_and_why_it_leaves_a_figure_out(conv):
    """The titles the figures carried when the figures modules wrote them, now each family's `describe`; a family
    with no words of its own: its arch, encoding and pooling."""
    vit, swin = FAMILIES["vit"], FAMILIES["swin"]
    assert vit.describe(ModelConfig()) == "learned_1d (stem), cls"
    assert vit.describe(ModelConfig(pos_encoding="learned_2d", pos_injection="every_layer", pooling="gap",
                                    reg_tokens=4)) == "learned_2d (every_layer), gap, 4 registers"
    assert swin.describe(ModelConfig(arch="swin", variant="T", shift=False)) == "Swin-T, relative_bias_2d, shift=False"
    assert conv.describe(ModelConfig(arch="conv", pos_encoding="none")) == "arch=conv, none, gap"
    assert set(vit.figure_notes) == {"patch_pca"} and set(swin.figure_notes) == {"rollout", "pos_similarity"}
    assert vit.figure_notes["patch_pca"].startswith("stem=hybrid: ") and conv.figure_notes == {}


CONV_FIT = ["--model.arch=conv", "--model.kernel_size=5", "--data.batch_size=16", "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.num_sanity_val_steps=0",
            "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu", "--run.wandb=off",
            "--run.fewshot_shots=[1]", "--run.shuffle_perms=2"]


@pytest.mark.slow  # trains
def test_a_convolutional_family_is_fitted_evaluated_shuffled_drawn_and_swept(conv, tmp_path, capfd, monkeypatch):
    """fit, eval, the shuffle metric, viz (what applies, a line for the rest), a transfer refused in one line,
    and a sweep (a dry run, then its one trial in its own process) for a family with no attention."""
    import json

    import yaml

    from vit_lightning.analysis import evaluate
    from vit_lightning.commands.fit import main as train
    from vit_lightning.commands.sweep import cli as sweep_cli
    from vit_lightning.commands.viz import cli as viz_cli

    monkeypatch.chdir(tmp_path)
    assert train.main([*CONV_FIT, "--run.root=runs", "--run.trial=c"]) == 0
    run = tmp_path / "runs/adhoc/local/c"
    record = json.loads((run / "results.json").read_text())
    assert record["status"] == "completed" and record["config"]["model.kernel_size"] == 5
    assert record["config"]["model.arch"] == "conv" and record["config"]["model.pooling"] == "gap"
    metrics = record["metrics"]
    assert 0 <= metrics["val/acc_shuffled"] <= 1 and "val/shuffle_drop" in metrics  # the shuffle metric
    assert 0 <= metrics["val/fewshot1"] <= 1  # the probe reads its pre-logits
    # eval: as trained (it offers no resizing), at the accuracy fit measured on the same weights
    assert evaluate.main([str(run), "--shots", "1", "--shuffle-perms", "2", "--out", str(tmp_path / "eval.json")]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())["metrics"]
    assert 0 <= evaluated["val/acc"] <= 1 and "val/acc_shuffled" in evaluated
    # viz: a line for each figure that does not apply (its stem has no patch-embedding filters of pixels, it has no
    # attention maps)
    capfd.readouterr()
    assert viz_cli.main([str(run), "--images", "2", "--out", str(tmp_path / "viz"), "--wandb", "off"]) == 0
    drawn = {p.name for p in (tmp_path / "viz").iterdir()}
    assert {"patch_pca.txt", "attention.txt"} <= drawn and not {"rollout.png", "patch_pca.png"} & drawn
    assert (tmp_path / "viz/attention.txt").read_text().strip() == ("arch=conv does not offer attention maps, needed by "
                                                                    "the attention distance and rollout figures")
    assert (tmp_path / "viz/patch_pca.txt").read_text().strip() == "arch=conv: no patch-embedding filters of pixels to draw"
    # a transfer from it: refused in one line before anything is written
    capfd.readouterr()
    assert train.main([*CONV_FIT, "--run.root=ft", f"--model.init_from={run}"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "arch=conv does not offer resizing to a new grid" in err[0], err
    assert not (tmp_path / "ft").exists()
    # a sweep: its trial runs as `vit-ablate fit` in its own process, which finds the family by its entry point
    params = {a[2:].split("=", 1)[0]: {"value": yaml.safe_load(a.split("=", 1)[1])} for a in CONV_FIT}
    params.update({"run.root": {"value": "runs"}, "run.ablation": {"value": "conv"}, "run.profile": {"value": "p"},
                   "run.wandb": {"value": "off"},  # (YAML would read a bare off as false)
                   "model.kernel_size": {"values": [3]}, "seed_everything": {"values": [0]}})
    sweep = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"}, "program": "vit-ablate",
             "command": ["${env}", "vit-ablate", "fit", "${args}"], "parameters": params}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    assert sweep_cli.main(["s.yaml", "--dry-run"]) == 0
    (line,) = [x for x in capfd.readouterr().out.splitlines() if "--model.arch=conv" in x]
    assert "vit-ablate fit" in line and "--model.kernel_size=3" in line
    assert sweep_cli.main(["s.yaml", "--backend", "local"]) == 0
    (swept,) = [json.loads(p.read_text()) for p in (tmp_path / "runs/conv/p").glob("*/results.json")]
    assert swept["status"] == "completed" and swept["config"]["model.kernel_size"] == 3

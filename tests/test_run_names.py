"""Ad-hoc run names are pinned: the same options name the same run directory in every later version."""

from __future__ import annotations

import json

import pytest
import torch

from vit_lightning.commands.fit.main import FitCLI

# every option changed from its default (values that build a model on the demo data)
EVERY = ["--model.variant=Ti", "--model.patch_size=4", "--model.width=48", "--model.depth=2", "--model.heads=3",
         "--model.mlp_dim=96", "--model.pos_encoding=learned_2d", "--model.pos_injection=every_layer",
         "--model.pooling=gap", "--model.head=mlp_tanh", "--model.dropout=0.1", "--model.attn_dropout=0.1",
         "--model.drop_path=0.1", "--model.init=timm", "--model.optimizer=sgd", "--model.lr=0.01",
         "--model.weight_decay=0.01", "--model.momentum=0.8", "--model.warmup_epochs=2", "--model.schedule=linear",
         "--model.label_smoothing=0.1", "--model.pos_resample=bilinear", "--data.batch_size=16",
         "--data.random_crop=false", "--trainer.max_epochs=3", "--trainer.gradient_clip_val=0.5",
         "--seed_everything=3"]
PINNED = {
    "demo ViT": ([], "mnist5k-micro-p7-learned_1d-stem-cls-lr0.002-s0-8302e758"),
    "demo Swin": (["--model.arch=swin"], "mnist5k-swin-micro-p2-relative_bias_2d-stem-gap-lr0.002-s0-0c458569"),
    "fine-tuning": (["--model.init_from={src}", "--data.img_size=56"],
                    "ft-mnist5k-micro-p7-learned_1d-stem-cls-lr0.002-s0-7e0fe79f"),
    "every option": (EVERY, "mnist5k-Ti-p4-learned_2d-every_layer-gap-lr0.01-s3-1eec9930"),
}


@pytest.fixture
def source(tmp_path):
    """A finished run directory (a record naming its trial `src`, and a checkpoint) to fine-tune from."""
    src = tmp_path / "src"
    src.mkdir()
    torch.manual_seed(0)
    from vit_lightning.run.module import ViTClassifier

    model = ViTClassifier(variant="micro", patch_size=7, img_size=28, in_chans=1, num_classes=10)
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, src / "last.ckpt")
    (src / "results.json").write_text(json.dumps({"status": "completed", "trial": "src", "metrics": {}}))
    return src


def trial(argv: list[str], tmp_path, cls=FitCLI) -> str:
    return cls([*argv, f"--run.root={tmp_path}", "--run.wandb=off"]).flat["run.trial"]


@pytest.mark.parametrize("case", PINNED)
def test_ad_hoc_names_are_pinned(case, source, tmp_path):
    argv, name = PINNED[case]
    assert trial([a.format(src=source) for a in argv], tmp_path) == name


def test_a_new_option_with_a_default_renames_nothing(source, tmp_path):
    class Later(FitCLI):
        def add_arguments_to_parser(self, parser) -> None:
            super().add_arguments_to_parser(parser)
            parser.add_argument("--later.option", type=int, default=3)  # as if added in a later version

    for argv, name in PINNED.values():
        assert trial([a.format(src=source) for a in argv], tmp_path, Later) == name
    assert trial(["--later.option=4"], tmp_path, Later) != PINNED["demo ViT"][1]


def test_the_earlier_rule_names_as_the_previous_version_did(tmp_path):
    """Every value hashed: the demo names of the version before this rule, as that version printed them."""
    assert FitCLI([f"--run.root={tmp_path}"]).earlier_name == "mnist5k-micro-p7-learned_1d-stem-cls-lr0.002-s0-c7fb4914"
    swin = FitCLI(["--model.arch=swin", f"--run.root={tmp_path}"])
    assert swin.earlier_name == "mnist5k-swin-micro-p2-relative_bias_2d-stem-gap-lr0.002-s0-ff398c85"


@pytest.mark.slow
def test_an_ad_hoc_run_named_by_the_earlier_rule_is_noted_once(tmp_path, capsys):
    argv = [f"--run.root={tmp_path}", "--run.wandb=off", "--trainer.max_epochs=1", "--model.depth=1",
            "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1", "--run.fewshot_shots=[]"]
    cli = FitCLI(argv)
    earlier = cli.run_dir.parent / cli.earlier_name
    assert earlier != cli.run_dir
    earlier.mkdir(parents=True)
    capsys.readouterr()
    assert cli.fit_run() == 0
    err = capsys.readouterr().err
    assert f"an earlier version named this run {earlier.name}" in err and cli.run_dir.name in err
    assert FitCLI(argv).fit_run() == 0  # once: the run now has its directory under the new name
    assert "earlier version" not in capsys.readouterr().err

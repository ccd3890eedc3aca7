"""Every backbone family meets one contract; a third family enters by one registry entry, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import vit_lightning
from vit_lightning.model import FAMILIES, HEADS, Backbone, ViTConfig, build_backbone
from vit_lightning.model.config import check_choice
from vit_lightning.model.family import BackboneParts, Family, register
from vit_lightning.model.layers import Block


class Toy(BackboneParts, nn.Module):
    """A third family for the test: linear patch embedding, global-attention blocks, mean pooling."""

    def __init__(self, variant: str = "micro", **options):
        super().__init__()
        self.config = cfg = ViTConfig(arch="toy", variant=variant, **options)
        p = cfg.patch_size
        self.embed = nn.Linear(cfg.in_chans * p * p, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg.width, 2, 2 * cfg.width) for _ in range(TOY_VARIANTS[variant][1]))
        self.norm = nn.LayerNorm(cfg.width)
        self.head = HEADS[cfg.head](cfg.width, cfg.num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        p = self.config.patch_size
        tokens = nn.functional.unfold(x, p, stride=p).transpose(1, 2)  # (B, N, C p p)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, None)
        return self.norm(x).mean(1)  # (B, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))

    def resize(self, img_size, *, mode: str = "bicubic", window_size: int | None = None) -> None:
        self.config.img_size = img_size  # nothing depends on the grid

    def no_weight_decay(self) -> set[str]:
        return set()


TOY_VARIANTS = {"micro": (16, 1)}


def _check_toy(cfg: ViTConfig) -> None:
    check_choice("pooling (arch=toy)", cfg.pooling, ("gap",))
    cfg.width = cfg.width or TOY_VARIANTS[cfg.variant][0]
    cfg.check_positive("img_size", "in_chans", "num_classes", "patch_size", "width")


@pytest.fixture
def toy():
    """The toy family registered for one test, removed after it."""
    register(Family(name="toy", cls=Toy, variants=TOY_VARIANTS, encodings=("none",),
                    defaults={"pooling": "gap", "pos_encoding": "none", "patch_size": 4}, reads={},
                    architecture=(), demo_patch=4, check=_check_toy))
    yield FAMILIES["toy"]
    del FAMILIES["toy"]


def _build(arch: str, head: str = "linear") -> nn.Module:
    family = FAMILIES[arch]
    torch.manual_seed(0)
    return build_backbone(arch=arch, variant="micro", img_size=28, in_chans=1, num_classes=5,
                          patch_size=family.demo_patch, head=head)


def _contract(arch: str) -> None:
    """Shapes, no NaN, a gradient for every parameter, resize, pre_logits' width, the shared methods."""
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
    maps = model.attention_maps(x)
    assert maps and all(torch.allclose(m.sum(-1), torch.ones(())) for m in maps)
    # resize: a new size runs at that size; back again, the same shapes; to the same size, the same function
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    before = model(x)
    model.resize(28)
    assert torch.allclose(model(x), before, atol=1e-5)
    model.resize(42)
    assert model(torch.randn(2, 1, 42, 42)).shape == (2, 5)
    model.resize(28)
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes and model.config.img_size == 28
    # pre_logits: the head's hidden layer when it has one (what a few-shot probe reads), at the head's width
    mlp = _build(arch, head="mlp_tanh").eval()
    rep = mlp.pre_logits(x)
    assert rep.shape == feats.shape and torch.allclose(mlp.head[-1](rep), mlp(x), atol=1e-6)
    assert torch.allclose(rep, mlp.head[:-1](mlp.forward_features(x)))
    assert torch.equal(model.pre_logits(x), model.forward_features(x))  # a linear head: the pooled features


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_every_family_meets_the_contract(arch):
    _contract(arch)


def test_a_third_family_meets_the_contract_from_its_entry_alone(toy):
    _contract("toy")
    assert vit_lightning.model.family.family_of(_build("toy")) is toy


def test_an_option_another_family_reads_is_refused_by_one_rule(toy):
    """Each family's own options, away from their defaults, are refused for every other family, in one line."""
    for arch, family in FAMILIES.items():
        for other in FAMILIES.values():
            for name, unused in other.reads.items():
                if name in family.reads:
                    continue
                changed = 3 if unused is None else (not unused if isinstance(unused, bool) else
                                                    "timm" if isinstance(unused, str) and name == "init" else
                                                    "hybrid" if isinstance(unused, str) else
                                                    (2, 2) if isinstance(unused, tuple) else unused + 32)
                with pytest.raises(ValueError, match=f"model.{name}=.* applies to arch={other.name} only, "
                                                     f"not arch={arch}"):
                    ViTConfig(arch=arch, **{name: changed})


def test_no_package_file_outside_model_names_a_family():
    """Family names and classes live in model/ and each family's figures module only."""
    root = Path(vit_lightning.__file__).parent
    allowed = {root / (f.viz.split(".", 1)[1].replace(".", "/") + ".py") for f in FAMILIES.values() if f.viz}
    named = []
    for path in root.rglob("*.py"):
        if root / "model" in path.parents or path in allowed:
            continue
        text = path.read_text()
        named += [f"{path.relative_to(root)}: {arch}" for arch, family in FAMILIES.items()
                  if arch != "vit" and arch in text.lower()]
    assert named == []

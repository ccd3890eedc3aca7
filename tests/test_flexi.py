"""Patch-size transfer: PI-resize (FlexiViT) against its definition, a pinv computed apart and timm's function;
a trained run evaluated and fine-tuned at another patch size, the record saying what was done."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from tiny import TINY_MODEL

from vit_lightning import ViT, cli
from vit_lightning.commands.fit import main as train
from vit_lightning.model.flexi import pi_resize
from vit_lightning.run.transfer import Source, start_from


def _resize(x: torch.Tensor, size: int) -> torch.Tensor:
    """(n, p, p) patches -> (n, size, size): the antialiased bilinear resize PI-resize inverts."""
    return F.interpolate(x[:, None], size=(size, size), mode="bilinear", align_corners=False, antialias=True)[:, 0]


def _pinv_by_torch(p: int, q: int) -> torch.Tensor:
    """pinv(B^T) by torch.linalg.pinv, B built by resizing every one-pixel p x p patch: (q*q, p*p)."""
    basis = torch.eye(p * p, dtype=torch.float64).reshape(p * p, p, p)
    b = _resize(basis, q).reshape(p * p, q * q).T  # column j: the resized j-th basis patch
    return torch.linalg.pinv(b.T)


@pytest.mark.parametrize("p,q", [(4, 6), (7, 14), (3, 8)])
def test_a_token_of_a_patch_is_the_token_of_its_upsized_patch(p, q):
    torch.manual_seed(0)
    w = torch.randn(5, 3, p, p, dtype=torch.float64)  # (D, C, p, p)
    x = torch.randn(10, 3, p, p, dtype=torch.float64)  # patches
    w2 = pi_resize(w, (q, q))
    tokens = torch.einsum("ncij,dcij->nd", x, w)
    resized = _resize(x.reshape(-1, p, p), q).reshape(10, 3, q, q)
    torch.testing.assert_close(torch.einsum("ncij,dcij->nd", resized, w2), tokens)  # <x, w> = <resize(x), PI(w)>
    want = (w.reshape(15, p * p) @ _pinv_by_torch(p, q).T).reshape(5, 3, q, q)
    torch.testing.assert_close(w2, want)


@pytest.mark.parametrize("p,q", [(8, 5), (16, 8), (14, 16)])
def test_pi_resize_is_the_pseudo_inverse_in_either_direction(p, q):
    torch.manual_seed(1)
    w = torch.randn(4, 2, p, p, dtype=torch.float64)
    want = (w.reshape(8, p * p) @ _pinv_by_torch(p, q).T).reshape(4, 2, q, q)
    torch.testing.assert_close(pi_resize(w, (q, q)), want)


def test_resizing_to_the_same_size_is_the_identity():
    w = torch.randn(4, 3, 7, 7)
    assert pi_resize(w, (7, 7)) is w
    model = ViT("micro", img_size=28, in_chans=1, patch_size=7)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.resize(28, patch_size=7)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("p,q", [(16, 8), (16, 24), (7, 4), (14, 16)])
def test_pi_resize_equals_timms_resample_patch_embed(p, q):
    resample_patch_embed = pytest.importorskip("timm.layers").resample_patch_embed
    torch.manual_seed(2)
    w = torch.randn(6, 3, p, p)
    want = resample_patch_embed(w, [q, q], interpolation="bilinear", antialias=True)
    torch.testing.assert_close(pi_resize(w, (q, q)), want, atol=1e-5, rtol=1e-4)


def test_a_source_started_at_another_patch_size_has_the_resized_kernel_and_grid():
    torch.manual_seed(0)
    options = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, width=32, depth=2, heads=2, mlp_dim=64,
                   reg_tokens=1, pos_embed_class=False)
    old = ViT(**options)
    new = ViT(**{**options, "patch_size": 4})  # 28 px in patches of 4: a 7 x 7 grid
    start_from(new, Source(options, old.state_dict(), {"source": "test"}))
    torch.testing.assert_close(new.stem.proj.weight, pi_resize(old.stem.proj.weight.detach(), (4, 4)))
    assert new.pos.grid == (7, 7) and new(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    hybrid = ViT(**{**options, "stem": "hybrid", "hybrid_layers": (1,), "hybrid_width": 32})
    with pytest.raises(ValueError, match="hybrid stem has no patch kernel"):
        hybrid.resize(28, patch_size=4)


# ---- a demo run at other patch sizes ------------------------------------------------------------------------------
TINY = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_val_batches=2", "--run.wandb=off",
        "--trainer.limit_train_batches=5"]


@pytest.mark.slow
def test_eval_and_fine_tuning_at_another_patch_size(tmp_path, capsys):
    assert train.main([*TINY, f"--run.root={tmp_path}", "--run.trial=src"]) == 0  # the demo's patch 7
    run = tmp_path / "adhoc/local/src"
    assert cli.main(["eval", str(run), "--model.patch_size=4", "--shots", "--into-record"]) == 0
    out = json.loads((run / "eval-mnist5k-28px-p4.json").read_text())
    assert out["patch_size"] == 4 and out["source"]["patch_resize"] == {"from": 7, "to": 4, "kernel": "pi_resize (FlexiViT)"}
    assert 0 <= out["metrics"]["val/acc"] <= 1
    assert json.loads((run / "results.json").read_text())["eval"]["mnist5k@28px/native/p4"] == {**out["metrics"], **out["attention"]}
    # the same-grid control of the transfer view: image and patch scaled together, the 4x4 grid kept
    assert cli.main(["eval", str(run), "--model.patch_size=14", "--data.img_size=56", "--into-record"]) == 0
    kept = json.loads((run / "eval-mnist5k-56px-p14.json").read_text())
    assert kept["img_size"] == 56 and kept["source"]["patch_resize"]["to"] == 14
    record = json.loads((run / "results.json").read_text())
    assert record["eval"]["mnist5k@56px/both/p14"] == {**kept["metrics"], **kept["attention"]}
    # the transfer view reads both from the keys eval files them under
    from vit_lightning.commands.results.patch_transfer import _accuracy

    assert _accuracy(record, 4) == out["metrics"]["val/acc"]
    assert _accuracy(record, 14, same_grid=True) == kept["metrics"]["val/acc"]
    assert cli.main(["eval", str(run), "--model.patch_size=5", "--shots"]) == 2  # 28 px has no patches of 5
    assert "not divisible by patch_size=5" in capsys.readouterr().err
    assert train.main([*TINY, f"--run.root={tmp_path}", f"--model.init_from={run}", "--model.patch_size=14",
                       "--run.trial=ft"]) == 0
    record = json.loads((tmp_path / "adhoc/local/ft/results.json").read_text())
    assert record["status"] == "completed" and record["config"]["model.patch_size"] == 14
    assert record["init_from"]["patch_resize"] == {"from": 7, "to": 14, "kernel": "pi_resize (FlexiViT)"}


def test_the_patch_size_table_has_a_transfer_view_from_the_eval_records(tmp_path):
    import dataclasses

    from test_results import make, md_cells, table, write_run

    from vit_lightning import ablation as ablations

    real = ablations.load("patch_size")
    assert real.patch_transfer_reference[16] == 0.8141 and real.patch_transfer_source == "16"
    ab = dataclasses.replace(make("patch_size", "model.patch_size", None, [{"model.patch_size": [4, 7]}], seeds=(0, 1),
                                  layout="compute"), **{k: getattr(real, k) for k in (
                             "patch_transfer_reference", "patch_transfer_source", "patch_transfer_note")})
    _, md = table(ab, tmp_path)
    assert "evaluated at every patch size" not in md  # no eval records: no transfer view
    for seed in (0, 1):
        for patch, own, other in [(4, 0.9, 0.5), (7, 0.8, 0.3 + 0.1 * seed)]:
            name = write_run(tmp_path / "runs", ab, {"model.patch_size": patch}, seed, own, **{"model.img_size": 28})
            path = tmp_path / "runs/patch_size/demo" / name / "results.json"
            record = json.loads(path.read_text())
            record["metrics"]["val/acc"] = own
            record["eval"] = {f"mnist5k@28px/p{11 - patch}": {"val/acc": other}, "mnist5k@56px": {"val/acc": 0.0}}
            path.write_text(json.dumps(record))
    _, md = table(ab, tmp_path)
    view = md.split("evaluated at every patch size (columns) without fine-tuning")[1]
    assert md_cells(view, "trained \\ evaluated") == ["trained \\ evaluated", "4", "7"]
    assert md_cells(view, "4") == ["4", "**0.9000 ± 0.0000 (n=2)**", "0.5000 ± 0.0000 (n=2)"]
    assert md_cells(view, "7") == ["7", "0.3500 ± 0.0707 (n=2)", "**0.8000 ± 0.0000 (n=2)**"]
    assert md_cells(md, "16") == ["16", "0.7631", "0.8156", "0.8193", "0.8141", "0.7361", "0.5138", "0.0403"]
    assert "bwconrad/flexivit" in md

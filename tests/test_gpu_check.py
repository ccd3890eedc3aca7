"""`vit-ablate gpu-check`: its CPU dry run passes end to end, and the GPU run is the one the issue asks for."""

import pytest
import torch

from vit_lightning.ablation import BASE
from vit_lightning.bench import gpu_check
from vit_lightning.cli import main


@pytest.mark.slow
def test_dry_run_passes_every_step_and_writes_one_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report.md"
    assert main(["gpu-check", "--dry-run", "--out", str(out)]) == 0
    text = out.read_text()
    assert "all steps passed" in text and "FAILED" not in text
    assert text.count(": passed (") == 4
    assert "| ours learned_1d/cls | bf16+compile |" in text and "| timm | bf16+compile |" in text
    assert "| ours relative_bias_2d/cls | bf16 |" in text  # every encoding's step time
    assert "precision bf16-mixed" in text and "train/loss per epoch" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # runs went to a temporary folder


def test_the_gpu_run_is_the_profiles_run():
    assert gpu_check.GPU_BENCH[gpu_check.GPU_BENCH.index("--variant") + 1] == "B"
    assert gpu_check.GPU_BENCH[gpu_check.GPU_BENCH.index("--img-size") + 1] == "224"
    fit = gpu_check.cifar10_fit_args(dry=False)
    changed = {k for k in BASE["cifar10"] if fit[k] != BASE["cifar10"][k]}
    assert changed == {"data.name", "data.download", "trainer.max_epochs", "trainer.devices"}
    assert (fit["data.name"], fit["trainer.max_epochs"], fit["trainer.precision"]) == ("synthetic", 2, "bf16-mixed")
    ddp = gpu_check.ddp_fit_args(dry=False)
    assert (ddp["trainer.strategy"], ddp["trainer.accelerator"], ddp["trainer.devices"], ddp["model.compile"]) == \
        ("ddp", "gpu", 1, True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without a GPU")
def test_without_a_gpu_it_says_so(tmp_path, capsys):
    assert main(["gpu-check", "--out", str(tmp_path / "r.md")]) == 2
    assert "--dry-run" in capsys.readouterr().err and not (tmp_path / "r.md").exists()


@pytest.mark.slow
def test_a_failed_step_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    def broken():
        raise RuntimeError("no kernel image is available")

    plan = [("first", lambda: ["fine"]), ("second", broken), ("third", lambda: ["also fine"])]
    monkeypatch.setattr(gpu_check, "steps", lambda dry, tmp: plan)
    out = tmp_path / "r.md"
    assert main(["gpu-check", "--dry-run", "--out", str(out)]) == 1
    text = out.read_text()
    assert "**1 of 3 steps failed**" in text and "### second: FAILED" in text and "no kernel image" in text
    assert "### first: passed" in text and "also fine" in text

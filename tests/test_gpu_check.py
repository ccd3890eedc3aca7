"""`vit-ablate gpu-check`: its CPU dry run passes end to end, and the GPU run is the one the issue asks for."""

import pytest
import torch

from vit_lightning.ablation import BASE
from vit_lightning.cli import main
from vit_lightning.commands.bench import gpu_check, profile_run


@pytest.mark.slow
@pytest.mark.timeout(900)  # five steps that start four fit processes and compile five models
def test_dry_run_passes_every_step_and_writes_one_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report.md"
    assert main(["gpu-check", "--dry-run", "--out", str(out), "--trials-per-gpu", "2"]) == 0
    text = out.read_text()
    assert "all steps passed" in text and "FAILED" not in text
    assert text.count(": passed (") == 6
    assert "| ours learned_1d/cls | bf16+compile |" in text and "| timm | bf16+compile |" in text
    assert "| ours relative_bias_2d/cls | bf16 |" in text  # every encoding's step time
    assert "| ours rope_axial/cls | bf16+compile |" in text  # and compiled, in the step of its own
    assert "precision bf16-mixed" in text and "train/loss per epoch" in text
    assert "one trial alone: " in text and "2 trials on one GPU: " in text
    assert "pos_encoding --profile cifar10 2 trials per GPU: 54 trials x 100 epochs x 50,000 images / " in text
    # the position benchmark's GPU profile: 150 trials x 30 epochs x 4,000 glyph images over one trial's rate
    assert "pos_diagnostic --profile gpu (rope_axial on the relative task here): 150 trials x 30 epochs x 4,000 " \
           "images (training and validation) / " in text
    assert "micro/8 16px fed with <= 4 workers, JPEGs decoded on the device: " in text  # the headline's last line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # runs went to a temporary folder


def test_the_gpu_run_is_the_profiles_run():
    assert gpu_check.GPU_BENCH[gpu_check.GPU_BENCH.index("--variant") + 1] == "B"
    assert gpu_check.GPU_BENCH[gpu_check.GPU_BENCH.index("--img-size") + 1] == "224"
    profile = gpu_check.GPU_PROFILE_BENCH  # the compiled encodings at the cifar10 profile's model and batch
    base = BASE["cifar10"]
    assert [profile[profile.index(k) + 1] for k in ("--variant", "--patch-size", "--batch-size", "--img-size")] == \
        [base["model.variant"], str(base["model.patch_size"]), str(base["data.batch_size"]), "32"]
    fit = profile_run.rate_fit_args(dry=False)
    changed = {k for k in base if fit[k] != base[k]}
    assert changed == {"data.name", "data.download", "trainer.max_epochs", "trainer.devices"}
    assert (fit["data.name"], fit["trainer.max_epochs"], fit["trainer.precision"]) == \
        ("synthetic_cifar", profile_run.RATE_EPOCHS, "bf16-mixed")
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
    monkeypatch.setattr(gpu_check, "steps", lambda dry, tmp, *_: plan)
    out = tmp_path / "r.md"
    assert main(["gpu-check", "--dry-run", "--out", str(out)]) == 1
    text = out.read_text()
    assert "**1 of 3 steps failed**" in text and "### second: FAILED" in text and "no kernel image" in text
    assert "### first: passed" in text and "also fine" in text


def test_the_check_is_planned_under_8_minutes_one_budget_per_step(tmp_path):
    assert len(gpu_check.PLAN_S) == len(gpu_check.steps(dry=True, tmp=tmp_path))
    assert sum(gpu_check.PLAN_S.values()) <= gpu_check.BUDGET_S == 480


def record(steady: float, total: float, epochs: int = 3) -> dict:
    return {"compute": {"steady_images_per_s": steady, "train_images_per_s": total}, "metrics": {"epochs": epochs}}


def test_the_projection_is_trials_x_epochs_x_images_over_the_aggregate_rate():
    from vit_lightning.ablation import load
    from vit_lightning.commands.sweep import trials, yamls

    configs = [c for _, c in yamls.sweep_configs(load("pos_encoding"), "cifar10")]
    count = len(trials.build(configs))
    assert profile_run.workload() == (count, 100, 50_000) and count == 54  # Table 8 and the later encodings
    lines = profile_run.rate_lines(record(9000.0, 8000.0), [record(6000.0, 5000.0)] * 3, step_rate=10_000.0)
    text = "\n".join(lines)
    assert "one trial alone: 9,000 img/s steady (epochs 2-3), 8,000 img/s over all its epochs" in text
    assert "3 trials on one GPU: 6,000 + 6,000 + 6,000 = 18,000 img/s together (2.00x one alone)" in text
    assert "9,000 / 10,000 = 0.90 (target >= 0.90)" in text
    hours = 54 * 100 * 50_000 / 18_000 / 3600
    assert f"3 trials per GPU: 54 trials x 100 epochs x 50,000 images / 18,000 img/s = {hours:.2f} h" in text
    with pytest.raises(RuntimeError, match="no steady-state rate"):
        profile_run.steady(record(None, 1.0))


def test_bench_encodings_can_name_a_few(capsys):
    from vit_lightning.commands.bench import cli as bench
    from vit_lightning.model import ENCODINGS

    chosen = bench.chosen_encodings(bench.parser().parse_args(["--encodings", "rope_mixed"]))
    assert sorted(chosen) == sorted(["none", "learned_1d", "rope_mixed"])  # none: what every ratio is over
    assert bench.chosen_encodings(bench.parser().parse_args(["--encodings"])) == list(ENCODINGS)
    assert bench.chosen_encodings(bench.parser().parse_args([])) == []
    assert bench.main(["--encodings", "rope", "--device", "cpu"]) == 2
    assert "--encodings rope: unknown; valid: " in capsys.readouterr().err


def test_the_headline_says_whether_4_workers_feed_the_model_with_jpegs_decoded_on_the_device(tmp_path):
    step = {"name": "ours learned_1d/cls", "precision": "bf16", "compiled": False, "images_per_s": 500.0}
    [dry] = gpu_check.decode_feed({"models": [step], "data": []}, dry=True, tmp=tmp_path)  # measured here, on the CPU
    assert dry.startswith("micro/8 16px fed with <= 4 workers, JPEGs decoded on the device: ")
    assert "img/s per worker reading bytes for a step of " in dry and "a worker decoding in PIL: " in dry

    def gpu(per_worker: float, decode_on: str = "device") -> str:  # the imagenet row of the bench on a GPU
        row = {"profile": "imagenet", "model": "B/16 224px", "decode_on": decode_on, "per_worker_images_per_s": 230.0,
               "bytes_per_worker_images_per_s": per_worker, "step_images_per_s": 2000.0,
               "device_decode_images_per_s": 8000.0 if decode_on == "device" else None}
        [line] = gpu_check.decode_feed({"models": [], "data": [row]}, dry=False, tmp=tmp_path)
        return line

    assert gpu(500.0) == ("B/16 224px fed with <= 4 workers, JPEGs decoded on the device: yes (4 needed: 500 img/s per "
                          "worker reading bytes for a step of 2,000 img/s with the decode, which runs at 8,000 img/s on "
                          "the device; a worker decoding in PIL: 230 img/s)")
    assert ": **no** (5 needed: 499 img/s" in gpu(499.0)
    assert "not measured (data.decode_on=auto decodes on the cpu here" in gpu(500.0, decode_on="cpu")

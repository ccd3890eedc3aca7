"""`vit-ablate bench`: every model in every mode, FLOPs as counted by hand, outputs matched, and the helpers' formulas."""

import io
import json
from contextlib import redirect_stdout

import pytest
import torch

from vit_lightning.cli import main
from vit_lightning.commands.bench import loader, machine
from vit_lightning.commands.bench.report import render_markdown, render_text
from vit_lightning.commands.bench.timing import output_error, paired_ratio
from vit_lightning.model import ENCODINGS, POOLINGS

ARGS = ["bench", "--variant", "micro", "--img-size", "16", "--patch-size", "8", "--batch-size", "2", "--steps", "1",
        "--rounds", "3", "--warmup", "1", "--precision", "32", "bf16", "--encodings", "--profiles", "demo", "cifar10",
        "--data-images", "64", "--peak-size", "128", "--json"]


@pytest.fixture(scope="module")
def report():
    """One bench run, its --json output parsed, shared by the tests below."""
    out, threads = io.StringIO(), torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models gain nothing from threads, which stall on a busy machine
    try:
        with redirect_stdout(out):
            assert main(ARGS) == 0
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.getvalue())


def micro_train_flops() -> float:
    """Forward and backward FLOPs of the micro ViT at 16 px / patch 8 with a [class] token, counted by hand."""
    n, t, d, mlp, depth, classes = 4, 5, 64, 256, 4, 1000
    block = t * d * 3 * d + t * d * d + 2 * t * d * mlp + 2 * t * t * d  # qkv, proj, MLP, QK^T and AV
    patch = n * 3 * 8 * 8 * d
    forward = depth * block + patch + d * classes  # multiply-adds
    return 2 * (3 * forward - patch)  # backward: 2x forward, but no gradient for the input images


def test_every_model_in_every_mode_with_its_measurements(report):
    names = {r["name"] for r in report["models"]}
    assert names == {"timm", *(f"ours {p}/cls" for p in ENCODINGS), *(f"ours learned_1d/{p}" for p in POOLINGS)}
    assert len(report["models"]) == 2 * len(names)  # fp32 and bf16, eager
    for r in report["models"]:
        assert len(r["step_s"]) == 3 and all(s > 0 for s in r["step_s"])
        assert r["match_error"] <= r["match_tolerance"]
    for name in ("ours learned_1d/cls", "timm"):
        rows = [r for r in report["models"] if r["name"] == name]
        assert all(r["train_flop_per_image"] == micro_train_flops() for r in rows)
        assert all(r["match_error"] < 1e-5 for r in rows if r["mode"] == "fp32")
        assert all(r["match_error"] > 1e-4 for r in rows if r["mode"] == "bf16")  # bf16 really ran
    assert report["peak_flop_per_s"]["32"] > 0 and report["peak_flop_per_s"]["bf16"] > 0


def test_paired_ratio_cancels_drift_that_hits_both():
    load = [1.0, 2.0, 4.0]  # the machine slows down round by round
    assert paired_ratio([0.5 * f for f in load], [0.6 * f for f in load]) == pytest.approx(1.2)
    assert paired_ratio([1.0, 1.0, 1.0], [2.0, 3.0, 9.0]) == 3.0  # the median, not the mean


def test_data_path_workers_from_rates(report):
    demo, cifar = (next(d for d in report["data"] if d["profile"] == p) for p in ("demo", "cifar10"))
    assert demo["workers_configured"] == 0 and demo["model"] == "micro/7 28px" and demo["precision"] == "32"
    # A GPU profile's step is not measured on a CPU; its loader is.
    assert cifar["step_images_per_s"] is None and cifar["per_worker_images_per_s"] > 0
    assert (cifar["dataset"], cifar["workers_configured"], cifar["batch_size"]) == ("synthetic", 8, 256)


def test_report_renders_every_row(report):
    text, markdown = render_text(report), render_markdown(report)
    for r in report["models"]:
        assert any(line.startswith(r["name"]) and r["mode"] in line for line in text.splitlines())
    assert markdown.count("\n| ours ") + markdown.count("\n| timm ") == len(report["models"])
    assert "targets:" in text and report["machine"]["cpu"] in text


def test_every_encodings_step_time_is_over_nones_of_the_same_run(report):
    from vit_lightning.commands.bench.report import encoding_table

    headers, rows = encoding_table(report)
    assert headers == ["pos_encoding", "step / none [fp32]", "step / none [bf16]"]
    assert [row[0] for row in rows] == list(ENCODINGS)  # every encoding, none's own row first at 1.00
    for name, *ratios in rows[1:]:
        for mode, shown in zip(("fp32", "bf16"), ratios):
            row = next(r for r in report["models"] if r["name"] == f"ours {name}/cls" and r["mode"] == mode)
            none = next(r for r in report["models"] if r["name"] == "ours none/cls" and r["mode"] == mode)
            assert shown == f"{1 / paired_ratio(row['step_s'], none['step_s']):.2f}"
    assert "position encodings (training-step time over none's" in render_text(report)


def test_step_time_targets_over_none_eager_and_compiled():
    from vit_lightning.commands.bench.report import targets

    def row(encoding, mode, vs_none):
        return {"name": f"ours {encoding}/cls", "kind": "ours", "pos_encoding": encoding, "pooling": "cls",
                "mode": mode, "precision": "32", "compiled": "compile" in mode, "vs_none": vs_none, "vs_timm": None}

    rows = [row("none", m, None) for m in ("fp32", "fp32+compile")]
    rows += [row("alibi_2d", "fp32", 1 / 1.2), row("alibi_2d", "fp32+compile", 1 / 1.4),
             row("rope_axial", "fp32", 1 / 1.8), row("peg", "fp32+compile", 1 / 1.1)]
    report = {"models": rows, "machine": {"device": "cpu", "bf16_matmul": "-"},
              "config": {"variant": "micro", "patch_size": 8, "img_size": 16}}
    got = {t["target"]: (round(t["value"], 6), t["threshold"], t["met"]) for t in targets(report)}
    assert got == {"fp32 step time ours alibi_2d/cls / none": (1.2, 1.3, True),
                   "fp32+compile step time ours alibi_2d/cls / none": (1.4, 1.3, False),
                   "fp32 step time ours rope_axial/cls / none": (1.8, 2.0, True),  # RoPE's eager target is 2x
                   "fp32+compile step time ours peg/cls / none": (1.1, 1.3, True)}


def test_workers_needed_and_the_warning():
    assert loader.workers_needed(1000, 300) == 4 and loader.workers_needed(900, 300) == 3
    assert loader.workers_needed(10, 300) == 1
    facts = loader.profile_facts("cifar10")
    assert facts.num_workers == 8
    assert loader.feed_warning(facts, per_worker=1000, step=8000, cores=32) is None
    short = loader.feed_warning(facts, per_worker=1000, step=8001, cores=32)
    assert "cannot keep up" in short and "--data.num_workers=9" in short
    assert "16 cores" in loader.feed_warning(facts, per_worker=1000, step=20_000, cores=16)
    demo = loader.profile_facts("demo")  # no workers: loading adds to each step
    assert loader.feed_warning(demo, per_worker=10_000, step=1000, cores=2) is None
    assert "adds 50%" in loader.feed_warning(demo, per_worker=2000, step=1000, cores=2)


def test_output_error_is_in_units_of_the_reference_rms():
    ref = torch.tensor([[3.0, -4.0], [0.0, 0.0]])  # RMS 2.5
    assert output_error(ref + torch.tensor([[0.0, 0.5], [0.0, 0.0]]), ref) == pytest.approx(0.2)


def test_compile_without_a_compiler_is_reported_not_run(monkeypatch, capsys):
    monkeypatch.setattr(machine.shutil, "which", lambda name: None)
    reason = machine.compile_unavailable(torch.device("cpu"))
    assert "C++ compiler" in reason
    args = ["bench", "--variant", "micro", "--img-size", "16", "--patch-size", "8", "--batch-size", "2", "--steps", "1",
            "--rounds", "1", "--warmup", "1", "--peak-size", "128", "--no-timm", "--profiles", "--compile", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compile_unavailable"] == reason and not any(r["compiled"] for r in out["models"])
    assert any("torch.compile not measured" in w for w in out["warnings"])


@pytest.mark.parametrize("extra,mentions", [(["--img-size", "30", "--patch-size", "8"], "valid patch sizes"),
                                            (["--rounds", "0"], "--rounds must be a positive integer")])
def test_bad_arguments_fail_in_one_line_before_measuring(extra, mentions, capsys):
    assert main(["bench", "--variant", "micro", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and mentions in captured.err and captured.err.count("\n") == 1


def test_swin_candidate_is_paired_with_timms_swin():
    from vit_lightning.commands.bench.cli import add_ratios
    from vit_lightning.commands.bench.models import subjects

    names = [s.name for s in subjects("micro", 56, 8, False, True, {"swin": "micro"})]
    assert names == ["ours learned_1d/cls", "ours swin-micro", "timm swin-micro", "timm"]
    pair = subjects("micro", 56, 8, False, True, {"swin": "micro"})[1:3]
    x = torch.randn(2, 3, 56, 56)
    assert [sum(p.numel() for p in s.model.parameters()) for s in pair] == [202_612, 202_612]
    assert all(s.model.train()(x).shape == (2, 1000) for s in pair)
    rows = [{"name": n, "kind": n.split()[0], "mode": "fp32", "precision": "32", "step_s": [t] * 3}
            for n, t in [("ours learned_1d/cls", 1.0), ("ours swin-micro", 2.0), ("timm swin-micro", 4.0), ("timm", 2.0)]]
    add_ratios(rows)
    assert [r["vs_timm"] for r in rows] == [2.0, 2.0, None, None]  # swin over timm's swin, the ViT over timm's ViT


@pytest.mark.slow
def test_init_comparison_trains_every_pairing_and_tells_a_real_deficit_from_noise():
    from vit_lightning.commands.bench import init_vs_timm

    out = io.StringIO()
    with redirect_stdout(out):
        init_vs_timm.main(["--epochs", "1", "--seeds", "0", "--batches", "2"])
    lines = out.getvalue().splitlines()[1:]
    assert [line.split(":")[0] for line in lines] == [f"{p}/{e}" for p, e in init_vs_timm.PAIRINGS]
    assert all("paper" in line and "timm ViT" in line for line in lines)
    assert init_vs_timm.verdict([0.80, 0.81, 0.79], [0.90, 0.91, 0.89]).startswith("ours below")
    assert init_vs_timm.verdict([0.90, 0.88, 0.91], [0.90, 0.91, 0.89]).startswith("not below")
    assert init_vs_timm.verdict([0.95, 0.96, 0.94], [0.90, 0.91, 0.89]).startswith("not below")


# --- an image folder decoded on the device (data.decode_on=device) -----------------------------------------------
def test_an_image_folder_is_measured_decoding_in_pil_and_reading_bytes_only(tmp_path):
    from dataclasses import replace

    from vit_lightning.commands.bench.gpu_check import dry_folder_facts

    cpu, facts = torch.device("cpu"), dry_folder_facts()  # the imagenet profile's loader at 16 px, decoding on the device
    loader.write_jpegs(tmp_path, 8, size=(64, 48))
    rates = loader.folder_rates(facts, 8, tmp_path, cpu, step=None)
    assert rates["decode_on"] == "device" and "device_decode_images_per_s" not in rates  # no step: nothing slowed
    assert rates["bytes_per_worker_images_per_s"] > rates["per_worker_images_per_s"] > 0  # no decode, no transform
    rates = loader.folder_rates(facts, 8, tmp_path, cpu, step=1000.0)
    decode = rates["device_decode_images_per_s"]
    assert decode > 0 and rates["step_images_per_s"] == pytest.approx(1 / (1 / 1000 + 1 / decode))  # decode, then step
    auto = replace(facts, data={**facts.data, "decode_on": "auto"})  # the profile's own: no nvJPEG here, PIL feeds
    auto = loader.folder_rates(auto, 8, tmp_path, cpu, step=1000.0)
    assert auto["decode_on"] == "cpu" and not {"device_decode_images_per_s", "step_images_per_s"} & set(auto)


def test_a_profile_decoding_on_its_device_is_fed_by_workers_that_read_bytes(monkeypatch):
    from dataclasses import replace
    from types import SimpleNamespace

    from vit_lightning.commands.bench import cli as bench
    from vit_lightning.commands.bench.gpu_check import dry_folder_facts
    from vit_lightning.commands.bench.report import data_table

    # the imagenet profile at 16 px on a CPU "accelerator", so its step is measured here, on the device it decodes on
    facts = replace(dry_folder_facts(), accelerator="cpu", num_workers=1)
    monkeypatch.setattr(loader, "profile_facts", lambda name: facts)
    args = SimpleNamespace(profiles=["imagenet"], data_images=8, warmup=1, steps=1)
    [row] = bench.measure_profiles(args, torch.device("cpu"))
    assert row["decode_on"] == "device" and row["device_decode_images_per_s"] > 0
    assert row["workers_needed"] == loader.workers_needed(row["step_images_per_s"], row["bytes_per_worker_images_per_s"])
    headers, [shown] = data_table({"data": [row]})
    assert shown[headers.index("bytes-only img/s per worker")] == f"{row['bytes_per_worker_images_per_s']:,.0f}"
    assert shown[headers.index("device decode img/s")] == f"{row['device_decode_images_per_s']:,.0f}"
    assert "with the decode" in shown[headers.index("step img/s (batch, precision)")]

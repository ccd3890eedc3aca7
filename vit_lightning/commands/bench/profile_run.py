"""Real `vit-ablate fit` runs for `vit-ablate gpu-check`: one checked fit, and the cifar10 profile's trial rate.

The trial rate: cifar10-profile trials on CIFAR-sized synthetic data (synthetic_cifar, 50,000 training images),
first one alone, then N at once on the same GPU (each pinned and given its share of loader workers as the sweep's
--trials-per-gpu gives them); each trial's steady rate is its training img/s after its first epoch (compile,
warm-up and the loader's start excluded), and N trials' aggregate is the sum of theirs. The whole Table 8 cifar10
profile then takes trials x epochs x images / aggregate rate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import vit_lightning
from vit_lightning.ablation import BASE
from vit_lightning.run.rundir import read_record, run_dirs

FIT_COMMON = {"data.name": "synthetic", "data.download": False, "run.wandb": "off", "run.ablation": "gpu-check",
              "trainer.devices": 1, "trainer.enable_progress_bar": False}
RATE_EPOCHS = 3  # the first is warm-up; the steady rate is the other two's
CIFAR10_TRAIN = 50_000  # CIFAR-10's training images: the cifar10 profile validates on its test split
PROJECTED = ("pos_encoding", "cifar10")  # the profile whose time is projected: Table 8 and the later encodings


def rate_fit_args(dry: bool, seed: int = 0) -> dict:
    """A cifar10-profile trial for RATE_EPOCHS epochs on synthetic_cifar, without the analyses after fit."""
    settings = {**BASE["cifar10"], **FIT_COMMON, "data.name": "synthetic_cifar", "trainer.max_epochs": RATE_EPOCHS,
                "run.profile": "cifar10", "run.fewshot_shots": [], "run.shuffle_perms": 0, "seed_everything": seed}
    if dry:  # a micro ViT on a few batches of the small synthetic set, on the CPU
        settings.update({"data.name": "synthetic", "model.variant": "micro", "model.patch_size": 8,
                         "data.batch_size": 32, "data.num_workers": 1, "trainer.accelerator": "cpu",
                         "model.warmup_epochs": 0, "model.lr": 0.003, "trainer.limit_train_batches": 4,
                         "trainer.limit_val_batches": 1, "trainer.max_epochs": 2})
    return settings


def start_fit(settings: dict, root: Path, dry: bool, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`vit-ablate fit` in a fresh process, as a sweep trial runs, under `root`; its output to root/fit.log."""
    argv = [f"--{k}={json.dumps(v) if isinstance(v, (bool, list)) else v}" for k, v in settings.items()]
    package_root = str(Path(vit_lightning.__file__).resolve().parents[1])
    full = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", **(env or {}),
            "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    if dry:
        full["OMP_NUM_THREADS"] = "1"  # tiny sizes gain nothing from threads, which stall on a busy CI machine
    command = [sys.executable, "-m", "vit_lightning.cli", "fit", *argv, f"--run.root={root}"]
    root.mkdir(parents=True)
    with open(root.parent / f"{root.name}.log", "w") as log:
        return subprocess.Popen(command, cwd=root.parent, env=full, stdout=log, stderr=subprocess.STDOUT, text=True)


def finish_fit(proc: subprocess.Popen, settings: dict, root: Path, timeout: float) -> dict:
    """Wait for a started fit; its record, checked to be complete (RuntimeError naming what is not)."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"fit did not finish in {timeout:.0f} s") from None
    if code != 0:
        tail = "\n".join((root.parent / f"{root.name}.log").read_text().strip().splitlines()[-20:])
        raise RuntimeError(f"fit exited {code}; the end of its output:\n{tail}")
    [directory] = [run for folder in root.glob("*/*") for run in run_dirs(folder)]
    record = read_record(directory) or {}
    history = record.get("history") or []
    if record.get("status") != "completed" or len(history) != settings["trainer.max_epochs"]:
        raise RuntimeError(f"record incomplete: status {record.get('status')}, {len(history)} epochs: {record.get('error')}")
    missing = [k for k in ("params", "gflops_per_image", "train_images_per_s", "wall_s") if record["compute"].get(k) is None]
    if missing or "val/acc" not in record["metrics"]:
        raise RuntimeError(f"record incomplete: compute lacks {missing} or metrics lack val/acc")
    return record


def fit(settings: dict, root: Path, timeout: float, dry: bool) -> dict:
    """One fit, run to its end; its checked record."""
    return finish_fit(start_fit(settings, root, dry), settings, root, timeout)


def together(count: int, root: Path, timeout: float, dry: bool) -> list[dict]:
    """`count` cifar10-profile trials at once on this process's first GPU (or its CPU), as --trials-per-gpu runs them."""
    from vit_lightning.commands.sweep.supervise import slot_envs, visible_gpus

    gpus = visible_gpus()[:1]
    envs = slot_envs([gpus], per_group=count)
    runs = [(rate_fit_args(dry, seed), root / f"trial{seed}") for seed in range(count)]
    procs = [start_fit(settings, where, dry, env) for (settings, where), env in zip(runs, envs)]
    try:
        return [finish_fit(proc, settings, where, timeout) for proc, (settings, where) in zip(procs, runs)]
    finally:
        for proc in procs:  # one failed: the others are stopped, not left on the GPU
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def steady(record: dict) -> float:
    """A trial's steady training rate (img/s after its first epoch); RuntimeError when the record has none."""
    value = record["compute"].get("steady_images_per_s")
    if not value:
        raise RuntimeError("the record has no steady-state rate (it trained a single epoch)")
    return float(value)


def workload() -> tuple[int, int, int]:
    """(trials, epochs, training images per epoch) of the projected profile, from its sweep."""
    from vit_lightning.ablation import load
    from vit_lightning.commands.sweep import trials, yamls

    ablation, profile = PROJECTED
    configs = [config for _, config in yamls.sweep_configs(load(ablation), profile)]
    runs = trials.build(configs)
    params = runs[0].params
    images = round(CIFAR10_TRAIN * (1 - float(params.get("data.holdout") or 0)))
    return len(runs), int(params["trainer.max_epochs"]), images


def projection_lines(rate: float, label: str) -> list[str]:
    """The projected profile's time at an aggregate training rate, with its formula."""
    trials, epochs, images = workload()
    seconds = trials * epochs * images / rate
    ablation, profile = PROJECTED
    return [f"{ablation} --profile {profile} {label}: {trials} trials x {epochs} epochs x {images:,} images / "
            f"{rate:,.0f} img/s = {seconds / 3600:.2f} h (training only: validation and start-up come on top)"]


def rate_lines(alone: dict, group: list[dict], step_rate: float | None) -> list[str]:
    """The report of the trial-rate step: each steady rate, the aggregate, the ratio to the bench's step, the projection."""
    one = steady(alone)
    rates = [steady(record) for record in group]
    total = sum(rates)
    epochs = alone["metrics"]["epochs"]
    lines = [f"one trial alone: {one:,.0f} img/s steady ({f'epochs 2-{epochs}' if epochs > 2 else 'epoch 2'}), "
             f"{alone['compute']['train_images_per_s']:,.0f} img/s over all its epochs",
             f"{len(group)} trials on one GPU: {' + '.join(f'{r:,.0f}' for r in rates)} = {total:,.0f} img/s "
             f"together ({total / one:.2f}x one alone)"]
    if step_rate:
        lines.append(f"one trial's steady rate / the bench's step for its model, batch and precision: "
                     f"{one:,.0f} / {step_rate:,.0f} = {one / step_rate:.2f} (target >= 0.90)")
    lines += projection_lines(one, "one trial at a time")
    lines += projection_lines(total, f"{len(group)} trials per GPU")
    return lines

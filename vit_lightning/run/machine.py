"""Whether this machine can run a trial as configured: the accelerator it asks for, its devices, its loader workers
and its data. `fit` asks before its run dir exists, a sweep before its first trial: one line, nothing recorded."""

from __future__ import annotations

import os

from vit_lightning.core.names import WORKERS_ENV
from vit_lightning.data.datamodule import SOURCES

GPU_NAMES = ("gpu", "cuda")  # what Lightning trains on CUDA with ("gpu" also means Apple's MPS)


def gpus_here() -> int:
    """CUDA devices torch can use in this process (CUDA_VISIBLE_DEVICES applied)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpus_here() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def accelerator_problem(accelerator, devices, gpus: int | None = None) -> str | None:
    """Why `trainer.accelerator` and `trainer.devices` cannot run here (`gpus`: those a trial sees), or None."""
    from lightning.pytorch.accelerators import MPSAccelerator, XLAAccelerator

    name = str(accelerator or "auto").lower()
    if name in GPU_NAMES:
        found = gpus_here() if gpus is None else min(gpus, gpus_here())
        if not found and name == "gpu" and MPSAccelerator.is_available():
            return None
        if not found:
            return (f"trainer.accelerator={name} needs a GPU and this machine has none (torch sees no CUDA device): "
                    "set trainer.accelerator=cpu to train on the CPU, or run it where a GPU is")
        wanted = _device_count(devices)
        if wanted is not None and wanted > found:
            return (f"trainer.devices={devices} asks for {wanted} GPUs; a trial sees {found} here: set "
                    f"trainer.devices to at most {found} (or auto)")
    elif name == "mps" and not MPSAccelerator.is_available():
        return "trainer.accelerator=mps needs Apple's MPS, which this machine lacks: set trainer.accelerator=cpu or auto"
    elif name == "tpu" and not XLAAccelerator.is_available():
        return "trainer.accelerator=tpu needs a TPU (torch_xla), which this machine lacks: set trainer.accelerator=auto"
    return None


def _device_count(devices) -> int | None:
    """GPUs `trainer.devices` asks for: a count, the highest index + 1 of a list, None for auto and -1 (all)."""
    if isinstance(devices, str):
        text = devices.strip()
        if text.lstrip("-").isdigit():
            devices = int(text)
        elif "," in text:
            devices = [int(part) for part in text.split(",") if part.strip().isdigit()]
        else:
            return None
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices if devices > 0 else None
    if isinstance(devices, (list, tuple)) and devices:
        return max(int(d) for d in devices) + 1
    return None


def workers_problem(workers, cpus: int | None = None) -> str | None:
    """Why `data.num_workers` loader processes do not fit this machine's CPUs, or None."""
    cpus = cpus or cpus_here()
    if isinstance(workers, int) and not isinstance(workers, bool) and workers > cpus:
        return (f"data.num_workers={workers} loader processes is more than the {cpus} CPU(s) here: set "
                f"data.num_workers to at most {max(0, cpus - 1)}")
    return None


def data_problem(data: dict) -> str | None:
    """Why the data a trial reads (its `data.*` options, unprefixed) is neither here nor downloadable, or None."""
    name = data.get("name")
    if name not in SOURCES:
        return None  # the options' own check names it
    try:
        source = SOURCES[name](data.get("root", "data"), bool(data.get("download")), data.get("val_split", 0.2),
                               data.get("split_seed", 0), img_size=data.get("img_size"), task=data.get("task"),
                               glyph_scale=data.get("glyph_scale", 1))
    except ValueError as err:
        return " ".join(str(err).split())
    return source.unavailable()


def problem(flat: dict, gpus: int | None = None, cpus: int | None = None) -> str | None:
    """Why one trial's flat options cannot run on this machine (its accelerator, devices, workers, data), or None.

    A sweep slot's share of the CPUs (WORKERS_ENV) caps the workers, as the data module caps them."""
    data = {key[5:]: value for key, value in flat.items() if key.startswith("data.")}
    workers = data.get("num_workers")
    if (share := os.environ.get(WORKERS_ENV, "")).isdigit() and isinstance(workers, int):
        workers = min(workers, int(share))
    return (accelerator_problem(flat.get("trainer.accelerator"), flat.get("trainer.devices"), gpus)
            or workers_problem(workers, cpus) or data_problem(data))

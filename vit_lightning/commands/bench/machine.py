"""Facts about the machine a benchmark ran on, so its numbers can be read later."""

from __future__ import annotations

import os
import platform
import shutil

import torch


def cpu_info() -> tuple[str, set[str]]:
    """The CPU's model name and feature flags (Linux /proc/cpuinfo; elsewhere the platform's name, no flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return platform.processor() or platform.machine(), set()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)  # the last core's entries
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return fields.get("model name", platform.machine()), set(fields.get("flags", "").split())


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load() -> list[float] | None:
    """1, 5 and 15 minute load averages: a shared machine shows here."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def bf16_matmul(device: torch.device) -> str:
    """Whether bf16 matmuls run on bf16 hardware (else they are emulated and slower than fp32)."""
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        return "native (tensor cores)" if major >= 8 else "emulated (compute capability < 8.0)"
    _, flags = cpu_info()
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    return f"native ({', '.join(native)})" if native else "emulated (no avx512_bf16 or amx_bf16 in the CPU flags)"


def compile_unavailable(device: torch.device) -> str | None:
    """Why torch.compile cannot run here (inductor needs a C++ compiler on CPUs, Triton on GPUs), or None."""
    if device.type == "cpu":
        compiler = os.environ.get("CXX") or "g++"
        if not any(shutil.which(c) for c in (compiler, "c++", "clang++")):
            return f"no C++ compiler found ({compiler}, c++, clang++): inductor compiles CPU kernels with one"
        return None
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed: inductor generates GPU kernels with it"
    return None


def facts(device: torch.device) -> dict:
    """Device, CPU, core count, library versions, bf16 hardware and the load average at the start."""
    model, _ = cpu_info()
    out = {"device": str(device), "device_name": model, "cpu": model, "cores": usable_cores(),
           "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
           "bf16_matmul": bf16_matmul(device), "load_before": load()}
    if device.type == "cuda":
        out["device_name"] = torch.cuda.get_device_name(device)
        out["cuda"] = torch.version.cuda
    try:
        import timm

        out["timm"] = timm.__version__
    except ImportError:
        out["timm"] = None
    return out

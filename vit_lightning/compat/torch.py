"""torch's private configuration and compile facts the benchmark and fit use (torch < 2.15, pyproject.toml)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def allow_recompiles(count: int) -> None:
    """Let torch.compile keep at least `count` compiled variants of one code object.

    Private: `torch._dynamo.config.recompile_limit` has no public setter; the benchmark compiles every
    model in every mode, each another entry in the caches of the same forward functions.
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, count)


def batch_dynamic(x: torch.Tensor) -> torch.Tensor:
    """Mark x's first (batch) dimension dynamic for torch.compile, so a short last batch reuses the graph.

    Private: `torch._dynamo.maybe_mark_dynamic` has no public name; it leaves a batch of one specialised
    instead of failing, as `mark_dynamic` would.
    """
    import torch._dynamo

    torch._dynamo.maybe_mark_dynamic(x, 0)
    return x


def compile_seconds() -> float:
    """Seconds this process has spent compiling with torch.compile so far (dynamo, AOTAutograd, the backend).

    Private: dynamo keeps its compile times in `torch._dynamo.utils.calculate_time_spent`; no public counter.
    """
    import torch._dynamo.utils

    return float(torch._dynamo.utils.calculate_time_spent().get("total_wall_time", 0.0))

"""torch's private configuration the benchmark sets (torch < 2.15, pyproject.toml)."""

from __future__ import annotations


def allow_recompiles(count: int) -> None:
    """Let torch.compile keep at least `count` compiled variants of one code object.

    Private: `torch._dynamo.config.recompile_limit` has no public setter; the benchmark compiles every
    model in every mode, each another entry in the caches of the same forward functions.
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, count)

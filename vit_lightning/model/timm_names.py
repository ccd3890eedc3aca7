"""Renaming timm's parameters to ours: an importer's rules, the first whose pattern matches a name wins."""

from __future__ import annotations

import re


def rename(name: str, rules: list[tuple[str, str]]) -> str | None:
    """Our name for a timm parameter by the first (pattern, replacement) rule that matches it; None when none does."""
    return next((re.sub(pattern, target, name) for pattern, target in rules if re.match(pattern, name)), None)

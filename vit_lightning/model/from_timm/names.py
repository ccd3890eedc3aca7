"""Renaming timm's parameters to ours: each importer's rules (names.yaml), the first whose pattern matches wins."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml


@cache
def rules(importer: str) -> tuple[tuple[str, str], ...]:
    """The (pattern, replacement) rules of one importer ('vit', 'swin' or 'eva'), read once from names.yaml."""
    tables = yaml.safe_load(Path(__file__).with_name("names.yaml").read_text())
    return tuple((pattern, target) for pattern, target in tables[importer])


def rename(name: str, importer: str) -> str | None:
    """Our name for a timm parameter by the first of the importer's rules that matches it; None when none does."""
    return next((re.sub(pattern, target, name) for pattern, target in rules(importer) if re.match(pattern, name)),
                None)

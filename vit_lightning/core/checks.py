"""Option checks and one-line error text shared by every command."""

from __future__ import annotations

import math


def check_choice(option: str, value, choices) -> None:
    """Refuse `value` for `option` in one line naming the valid choices, unless it is one of them."""
    if value not in choices:
        raise ValueError(f"unknown {option}={value!r}; choose from: {', '.join(map(str, choices))}")


def number_in(value, low: float, high: float, low_open: bool = False, high_open: bool = False,
               integer: bool = False) -> bool:
    """value is a finite number (an integer where `integer`; never a bool) within [low, high], ends open as asked."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not math.isfinite(value):
        return False
    return (low < value if low_open else low <= value) and (value < high if high_open else value <= high)


def span(low: float, high: float, low_open: bool = False, high_open: bool = False) -> str:
    """The range number_in checks, as it is written: (0, 10]."""
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def one_line(error: BaseException) -> str:
    """An error as 'TypeName: message' on one line."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def describe(error: OSError) -> str:
    """An OSError in one line, naming the file: 'runs/x/results.json: No space left on device'."""
    name = f"{error.filename}: " if error.filename else ""
    return f"{name}{error.strerror or ' '.join(str(error).split()) or type(error).__name__}"

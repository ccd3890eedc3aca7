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
    def bound(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"  # an integer bound (2**24) in full

    return f"{'(' if low_open else '['}{bound(low)}, {bound(high)}{')' if high_open else ']'}"


def range_error(option: str, value, low: float, high: float, low_open: bool = False, high_open: bool = False,
                integer: bool = False, what: str = "a number") -> str | None:
    """`option=value is out of range: ...` naming the option, its value and its range, or None when it is in it."""
    if number_in(value, low, high, low_open, high_open, integer):
        return None
    kind = "a whole number" if integer else what
    wrong = "out of range" if isinstance(value, (int, float)) and not isinstance(value, bool) else "not a number"
    return f"{option}={value!r} is {wrong}: {kind}, finite, in {span(low, high, low_open, high_open)}"


def non_finite(tree: dict, prefix: str = "") -> str | None:
    """The first option of a nested config whose value (or an item of it) is NaN or infinite, as one line naming it;
    None when all are finite. Read before identity.plain, which turns NaN into null."""
    for key, value in tree.items():
        if isinstance(value, dict):
            if error := non_finite(value, f"{prefix}{key}."):
                return error
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in items):
            return f"{prefix}{key}={value!r} is not a finite number; give a finite value"
    return None


def close_matches(name: str, known, cutoff: float = 0.8) -> list[str]:
    """Up to three names of `known` nearest to `name`, the nearest first."""
    import difflib

    return difflib.get_close_matches(name, sorted(known), n=3, cutoff=cutoff)


def suggest(name: str, known) -> str:
    """The choices for an unknown option: close matches, else the options of its group, else the groups."""
    if close := close_matches(name, known):
        return f"did you mean {', '.join(close)}?"
    group = name.split(".")[0] + "."
    if same := sorted(k for k in known if k.startswith(group)):
        return f"{group}* options: {', '.join(same)}"
    return f"options are seed_everything and {', '.join(sorted({k.split('.')[0] + '.*' for k in known if '.' in k}))}"


def one_line(error: BaseException) -> str:
    """An error as 'TypeName: message' on one line."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def describe(error: OSError) -> str:
    """An OSError in one line, naming the file: 'runs/x/results.json: No space left on device'."""
    name = f"{error.filename}: " if error.filename else ""
    return f"{name}{error.strerror or ' '.join(str(error).split()) or type(error).__name__}"

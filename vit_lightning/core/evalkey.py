"""The key an evaluation is filed under in a run record's `eval`: what it measured.

`<data>[:<task>:x<glyph scale>]@<N>px/<view>[/p<patch>][/<rule>...]`: the data, its question and glyph scale (data
that asks several questions only), the target side, and the view: how the images met it against the run's own
(`native`: as trained; `tokens`: the content at its trained scale on a canvas of N, more or fewer tokens, the same
patches; `zoom-only`, the view `zoom`: the content scaled by N over the trained side on the trained canvas, the same
tokens; `both`: resized to N, content zoom and tokens at once, the published protocol), then the patch size when it
differs from the run's, then the grid rules where not the defaults (`keep`: trained offsets and rows kept;
`rope-ntk`, `rope-yarn`: RoPE's frequencies scaled). Keys written before the views were named read as their views:
`canvas` is `tokens`, `zoom` (a resize to N) is `both`; and keys before those (`<data>@<N>px[/canvas][/p<patch>]`,
no task even for data that asks several) were measured on the run's own task and glyph scale, the eval's default,
and read as such (without `/canvas`: resized).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

VIEWS = ("native", "tokens", "zoom", "both")
SPELLED = {"native": "native", "tokens": "tokens", "zoom": "zoom-only", "both": "both"}  # in a key: `zoom` meant both
EARLIER_VIEWS = {"canvas": "tokens", "zoom": "both"}  # the key's words before the views were named
KEY = re.compile(r"(?P<data>[^@:/]+)(?::(?P<task>[^@:/]+):x(?P<scale>\d+))?@(?P<px>\d+)px"
                 r"/(?P<view>native|tokens|zoom-only|both|canvas|zoom)(?:/p(?P<patch>\d+))?"
                 r"(?P<rules>(?:/(?!p\d)[a-z][a-z0-9-]*)*)")
VIEW_OF = {**{spelled: view for view, spelled in SPELLED.items()}, **EARLIER_VIEWS}
EARLIER = re.compile(r"(?P<data>[^@:/]+)@(?P<px>\d+)px(?:/(?P<canvas>canvas))?(?:/p(?P<patch>\d+))?")


@dataclass(frozen=True)
class EvalKey:
    """What an evaluation measured; `earlier`: read from a key of before (its task and scale: the run's own)."""

    data: str
    img_size: int
    view: str  # one of VIEWS; an earlier key's non-canvas view is "both" (resized, or native with another patch)
    task: str | None = None
    scale: int | None = None
    patch: int | None = None
    earlier: bool = False
    rules: str = ""  # the grid rules away from their defaults, as in the key: "/keep/rope-ntk"; "": the defaults

    def __post_init__(self):
        if self.view not in VIEWS:
            raise ValueError(f"unknown eval view {self.view!r}; valid: {', '.join(VIEWS)}")

    def __str__(self) -> str:
        asks = f":{self.task}:x{self.scale}" if self.task is not None else ""
        return (f"{self.data}{asks}@{self.img_size}px/{SPELLED[self.view]}" + (f"/p{self.patch}" if self.patch else "")
                + self.rules)

    def of_run(self, config: dict) -> bool:
        """Measured on the run's own data, task and glyph scale (its config's flat keys)."""
        if self.data != config.get("data.name"):
            return False
        if self.task is None:  # data of one question, or a key of before on the run's own question and scale
            return True
        return self.task == config.get("data.task") and self.scale == (config.get("data.glyph_scale") or 1)


def parse(key: str) -> EvalKey | None:
    """The EvalKey a record's key stands for (either form), None for a key of neither."""
    if match := KEY.fullmatch(key):
        scale, patch = match["scale"], match["patch"]
        return EvalKey(match["data"], int(match["px"]), VIEW_OF[match["view"]], match["task"], scale and int(scale),
                       patch and int(patch), rules=match["rules"])
    if match := EARLIER.fullmatch(key):
        return EvalKey(match["data"], int(match["px"]), "tokens" if match["canvas"] else "both",
                       patch=match["patch"] and int(match["patch"]), earlier=True)
    return None

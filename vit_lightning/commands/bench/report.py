"""The bench report as text or markdown tables, and the issue's performance targets checked against it."""

from __future__ import annotations

from vit_lightning.commands.bench.models import ABSOLUTE, REFERENCE, paired_family
from vit_lightning.model import ENCODINGS
from vit_lightning.model.position import NO_POSITION

RATIOS = ("vs_timm", "vs_none", "vs_fp32", "vs_eager")


def si(value: float | None, unit: str = "") -> str:
    """1.23e11 -> '123 G' + unit."""
    if value is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".strip()


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def model_table(report: dict) -> tuple[list[str], list[list[str]]]:
    headers = ["model", "mode", "params", "train FLOP/img", "img/s", "FLOP/s", "% peak", *RATIOS, "match err", "1st step"]
    rows = []
    for r in report["models"]:
        match = f"{r['match_error']:.1e}" + ("" if r["match_error"] <= r["match_tolerance"] else " (!)")
        rows.append([r["name"], r["mode"], f"{r['params']:,}", si(r["train_flop_per_image"]), f"{r['images_per_s']:,.1f}",
                     si(r["flop_per_s"]), f"{100 * r['peak_fraction']:.1f}", *(_ratio(r[k]) for k in RATIOS), match,
                     f"{r['first_step_s']:.1f} s"])
    return headers, rows


def encoding_rows(report: dict) -> list[dict]:
    """Our ViT's rows that differ from `none` by their position encoding only ([class] pooling, every mode)."""
    return [r for r in report["models"] if r["kind"] == "ours" and r["pooling"] == "cls" and not paired_family(r["name"])]


def encoding_table(report: dict) -> tuple[list[str], list[list[str]]]:
    """Each position encoding's training-step time over `none`'s, measured in the same run and mode (< 1: faster)."""
    rows = encoding_rows(report)
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    table = []
    order = list(ENCODINGS)  # the model's order, none first
    for encoding in sorted(dict.fromkeys(r["pos_encoding"] for r in rows), key=order.index):
        ratio = {r["mode"]: r["vs_none"] for r in rows if r["pos_encoding"] == encoding}
        table.append([encoding, *(_ratio(1 / ratio[m] if ratio.get(m) else None) if encoding != NO_POSITION else "1.00"
                                  for m in modes)])
    return ["pos_encoding", *(f"step / none [{m}]" for m in modes)], table


def data_table(report: dict) -> tuple[list[str], list[list[str]]]:
    headers = ["profile", "dataset", "model", "loader img/s per worker", "bytes-only img/s per worker",
               "device decode img/s", "step img/s (batch, precision)", "workers needed", "workers configured"]
    rows = []
    for d in report["data"]:
        name = d["dataset"] + (f" ({d['jpeg_kib']:.0f} KiB JPEGs)" if d["jpeg_kib"] else "")
        step = f"- ({d['accelerator']} profile)" if d["step_images_per_s"] is None else f"{d['step_images_per_s']:,.0f}"
        decoding = " with the decode" if d.get("device_decode_images_per_s") else ""
        rows.append([d["profile"], name, d["model"], f"{d['per_worker_images_per_s']:,.0f}",
                     _rate(d.get("bytes_per_worker_images_per_s")), _rate(d.get("device_decode_images_per_s")),
                     f"{step}{decoding} ({d['batch_size']}, {d['precision']})", str(d["workers_needed"] or "-"),
                     str(d["workers_configured"])])
    return headers, rows


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _aligned(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(headers, *rows)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
    return "\n".join(lines)


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def header_lines(report: dict) -> list[str]:
    m, c, peak = report["machine"], report["config"], report["peak_flop_per_s"]
    return [
        f"command: {report['command']}",
        f"machine: {m['device']} ({m['device_name']}), CPU {m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch "
        f"threads, torch {m['torch']}, timm {m['timm']}, load average {m['load_before']} -> {m.get('load_after')}",
        f"config: {c['variant']}/{c['patch_size']} at {c['img_size']} px, batch {c['batch_size']}, "
        f"{c['rounds']} alternating rounds x {c['steps']} steps",
        f"matmul peak ({report['peak_size']}^2 loop): fp32 {si(peak['32'], 'FLOP/s')}, bf16 {si(peak['bf16'], 'FLOP/s')}; "
        f"bf16 matmul: {m['bf16_matmul']}",
    ]


NOTES = ("ratios: throughput of the row over the named baseline in the same mode (vs_timm, vs_none) or of the same "
         "model (vs_fp32: eager fp32, vs_eager: eager at the same precision), the median over rounds of paired "
         "times; > 1 is faster. match err: max |logits - eager fp32 logits| / RMS of the latter.")


def render_text(report: dict) -> str:
    parts = [*header_lines(report), "", _aligned(*model_table(report)), NOTES]
    if report["config"].get("encodings"):
        parts += ["", "position encodings (training-step time over none's, same run and mode):",
                  _aligned(*encoding_table(report))]
    if report["data"]:
        parts += ["", f"data path (one worker = one process with one thread; bytes-only: the worker of data.decode_on="
                  f"device; step = {REFERENCE}, eager):",
                  _aligned(*data_table(report))]
    parts += ["", "targets:"] + [f"  [{'met' if t['met'] else 'MISSED'}] {t['target']} {t['op']} {t['threshold']:g}: "
                                 f"{t['value']:.2f}{'  (' + t['note'] + ')' if t['note'] else ''}" for t in report["targets"]]
    return "\n".join(parts)


def render_markdown(report: dict) -> str:
    parts = ["\n".join(f"- {line}" for line in header_lines(report)), "", _markdown(*model_table(report)), "", NOTES]
    if report["config"].get("encodings"):
        parts += ["", _markdown(*encoding_table(report))]
    if report["data"]:
        parts += ["", _markdown(*data_table(report))]
    if report["targets"]:
        parts += ["", _markdown(["target", "value", "met"], [[f"{t['target']} {t['op']} {t['threshold']:g}",
                                                             f"{t['value']:.2f}", "yes" if t["met"] else "**no**"]
                                                            for t in report["targets"]])]
    if report["warnings"]:
        parts += ["", *(f"- warning: {w}" for w in report["warnings"])]
    return "\n".join(parts)


def targets(report: dict) -> list[dict]:
    """The performance targets that this report's rows can check; each with its value and whether it is met."""
    out = []

    def add(target: str, value: float | None, op: str, threshold: float, note: str = "") -> None:
        if value is not None:
            met = value >= threshold if op == ">=" else value <= threshold
            out.append({"target": target, "value": value, "op": op, "threshold": threshold, "met": met, "note": note})

    cuda = report["machine"]["device"].startswith("cuda")
    c = report["config"]
    size = f"{c['variant']}/{c['patch_size']} {c['img_size']}px"
    for r in report["models"]:
        if r["kind"] != "ours":
            continue
        if r["mode"] == "fp32" and (r["pooling"] == "cls" and r["pos_encoding"] in ABSOLUTE or paired_family(r["name"])):
            add(f"fp32 throughput {r['name']} / timm", r["vs_timm"], ">=", 1.0)
        if r["mode"] == "fp32" and r["pos_encoding"] not in ABSOLUTE and r["vs_none"]:
            rotary = ENCODINGS[r["pos_encoding"]].rotary  # RoPE rotates q and k in every block: eager, up to 2x (timm: 1.79x)
            add(f"fp32 step time {r['name']} / none", 1 / r["vs_none"], "<=", 2.0 if rotary else 1.3)
        if r["compiled"] and r["vs_none"] and r in encoding_rows(report):  # compiled, every encoding near none
            add(f"{r['mode']} step time {r['name']} / none", 1 / r["vs_none"], "<=", 1.3)
        if r["name"] != REFERENCE or r["precision"] != "bf16":
            continue
        if not cuda and not r["compiled"]:
            add(f"bf16 / fp32 throughput, {REFERENCE}", r["vs_fp32"], ">=", 1.3,
                f"bf16 matmul {report['machine']['bf16_matmul']}")
        if cuda:
            add(f"{size} bf16 [{r['mode']}] step, fraction of the bf16 matmul peak", r["peak_fraction"], ">=", 0.4)
            if r["compiled"]:
                add(f"{size} bf16 compiled / eager throughput", r["vs_eager"], ">=", 1.0)
    return out

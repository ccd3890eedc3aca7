"""The documentation: README.md as a short landing page whose links resolve, a site that builds strictly, and
reference pages that match the registries they are generated from (and say what the code does)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from decimal import Decimal
from pathlib import Path

import pytest

from vit_lightning import cli
from vit_lightning.commands.docs import pages as docs
from vit_lightning.model import ENCODINGS, FAMILIES, INJECTIONS
from vit_lightning.model.config import ModelConfig

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the site whose mkdocs.yml is in `root`."""
    assert importlib.util.find_spec("mkdocs") and importlib.util.find_spec("material"), \
        "MkDocs and its Material theme are not installed: pip install -e '.[dev]'"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's banner about a future MkDocs, not a problem
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_site_builds_strictly(tmp_path):
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "options" / "index.html").is_file()


def test_site_builds_strictly_with_the_builtin_theme(tmp_path):
    """The theme that replaces Material at its end of life (docs/design.md) builds the same pages strictly."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    config = (ROOT / "mkdocs.yml").read_text()
    plain = re.sub(r"theme:\n  name: material\n  features:\n(?:    - .*\n)+", "theme:\n  name: mkdocs\n", config)
    assert plain != config
    (tmp_path / "mkdocs.yml").write_text(plain)
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mkdocs" in (tmp_path / "site" / "index.html").read_text()


@pytest.mark.parametrize("damage", ["broken link", "page missing from the nav", "broken anchor"])
def test_strict_build_fails_on_damage(tmp_path, damage):
    """The strict build is a real check: a copy of the site with one fault fails it."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    index = tmp_path / "docs" / "index.md"
    assert build(tmp_path, tmp_path / "intact").returncode == 0
    if damage == "broken link":
        index.write_text(index.read_text() + "\n[gone](no-such-page.md)\n")
        named = "no-such-page.md"
    elif damage == "page missing from the nav":
        (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
        named = "orphan.md"
    else:
        index.write_text(index.read_text() + "\n[gone](reference/options.md#no-such-heading)\n")
        named = "no-such-heading"
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0, f"{damage} passed the strict build"
    assert named in result.stdout + result.stderr


def test_readme_is_a_landing_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert any(t.startswith("docs/") for t in targets), "README links into docs/"
    for target in targets:
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if anchor and path.endswith(".md"):
            headings = {slug(h) for h in re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)}
            assert anchor in headings, f"README links to {target}: no such heading"


# Hand-written pages (the generated reference/ aside), each checked against the committed tables it quotes
HAND_WRITTEN = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md"))]
QUOTED = re.compile(r"^```text\n((?:\|.*\n)+)```$", re.M)
# A paragraph quoting results opens with `<!-- numbers: results/<...>/table.md ...; elsewhere: 0.063 (why) -->` on its
# own line: its numbers come from those committed tables (as printed, or rounded), or are listed after `elsewhere:`
# with where they come from (the paper, an earlier draw)
MARKER = re.compile(r"^<!-- numbers: (.*?) -->\n", re.M)
NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?:e-?\d+)?(?!\w)")
RESULTS_LIKE = re.compile(r"(?<![\w.])\d+\.\d{3,}(?!\w)|± ?\d")  # an accuracy, p or spread: what tables print


def committed_tables() -> dict[str, str]:
    """Every committed results table's text by its path from the repository root: the file's, and where a user's own
    draw has replaced it (the README's main job with `--replace`) the text committed at HEAD too, which the pages
    quote."""
    return {str(p.relative_to(ROOT)): p.read_text() + at_head(p) for p in sorted((ROOT / "results").rglob("table.md"))}


def at_head(path: Path) -> str:
    """The text of `path` at git's HEAD where the file differs from it, else '' (and outside a git checkout)."""
    name = str(path.relative_to(ROOT))
    try:
        if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", name], cwd=ROOT).returncode != 1:
            return ""
        return "\n" + subprocess.run(["git", "show", f"HEAD:{name}"], cwd=ROOT, capture_output=True, text=True,
                                     check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def paragraphs(text: str) -> list[tuple[str | None, str]]:
    """(marker or None, paragraph) of a page's prose (code blocks aside), a marker belonging to the next paragraph."""
    out, marker = [], None
    for block in re.split(r"\n\s*\n", re.sub(r"```.*?```", "", text, flags=re.S)):
        if found := MARKER.match(block + "\n"):
            marker, block = found.group(1), block[found.end():]
        if block.strip():
            out.append((marker, block))
            marker = None
    return out


def unquoted(marker: str, paragraph: str, tables: dict[str, str]) -> list[str]:
    """The numbers of `paragraph` that neither the tables its marker names hold (as printed or rounded) nor it lists."""
    named, _, elsewhere = marker.partition("elsewhere:")
    sources = [tables[path] for path in named.rstrip("; ").split()]  # KeyError: a marker naming no committed table
    held = [float(x) for text in sources for x in NUMBER.findall(text)]
    listed = set(NUMBER.findall(elsewhere))

    def holds(token: str) -> bool:
        tolerance = 0.5 * 10 ** Decimal(token).as_tuple().exponent + 1e-12  # half a unit of the last digit written
        return any(abs(value - float(token)) <= tolerance for value in held)

    return [t for t in NUMBER.findall(paragraph) if t not in listed and not holds(t)]


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_tables_quoted_in_the_docs_are_the_committed_ones(page):
    """A results table quoted in a hand-written page (a ```text block of table rows) is a verbatim excerpt of a
    committed results table, so regenerating the results cannot leave a page quoting old numbers."""
    committed = committed_tables().values()
    quoted = QUOTED.findall(page.read_text())
    assert quoted or page.name != "README.md", "README quotes no results table"
    for block in quoted:
        assert any(block in table for table in committed), f"{page.name} quotes a table no results/ file holds:\n{block}"


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_numbers_in_the_docs_are_the_committed_ones(page):
    """Every number of a paragraph that quotes results is in the committed tables its marker names, or is listed
    with its source; a paragraph printing results (3 decimals, ±) without a marker fails by its first words."""
    tables = committed_tables()
    for marker, paragraph in paragraphs(page.read_text()):
        where = f"{page.name}: {' '.join(paragraph.split()[:8])}..."
        if marker is None:
            assert not RESULTS_LIKE.search(paragraph), f"{where} quotes results without a `<!-- numbers: -->` marker"
            continue
        for path in marker.partition("elsewhere:")[0].rstrip("; ").split():
            assert path in tables, f"{where}: its marker names {path}, no committed table"
        assert not unquoted(marker, paragraph, tables), f"{where}: not in its tables: {unquoted(marker, paragraph, tables)}"


def test_a_number_changed_by_hand_fails_the_check():
    """The check is real: a quoted mean changed in its last digit, or an unmarked result, fails."""
    tables = {"results/t/table.md": "| none | 0.8418 ± 0.0111 (n=5) | Holm p 0.183 |"}
    marker = "results/t/table.md; elsewhere: 0.063 (an earlier draw)"
    assert unquoted(marker, "none ends at 0.842 ± 0.011 (p 0.183; earlier 0.063)", tables) == []
    assert unquoted(marker, "none ends at 0.843 ± 0.011", tables) == ["0.843"]
    assert unquoted(marker, "none ends at 0.8419", tables) == ["0.8419"]
    page = "Intro 0.02.\n\n<!-- numbers: results/t/table.md -->\nnone 0.842\n\nlater 0.951 ± 0.020\n"
    assert [m for m, _ in paragraphs(page)] == [None, "results/t/table.md", None]
    assert RESULTS_LIKE.search(paragraphs(page)[2][1]) and not RESULTS_LIKE.search(paragraphs(page)[0][1])


def slug(heading: str) -> str:
    """MkDocs' (Python-Markdown toc's) anchor for a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"^python3 -m venv .*pytest.*$", ci, re.M).group(0)
    assert command in (ROOT / "README.md").read_text()


def test_reference_pages_are_current():
    """A committed generated page that differs from the registries fails here: run `vit-ablate docs`."""
    want = docs.pages()
    stale = docs.stale(ROOT / "docs" / "reference", want)
    assert not stale, f"out of date: {', '.join(stale)}; run `vit-ablate docs`"
    extra = {p.name for p in (ROOT / "docs" / "reference").glob("*.md")} - set(want)
    assert not extra, f"docs/reference/ holds pages nothing generates: {sorted(extra)}"


def test_docs_command_checks_and_writes(tmp_path, capsys):
    out = tmp_path / "reference"
    assert cli.main(["docs", "--check", "--out", str(out)]) == 1
    assert cli.main(["docs", "--out", str(out)]) == 0
    assert cli.main(["docs", "--check", "--out", str(out)]) == 0
    (out / "options.md").write_text((out / "options.md").read_text().replace("model.lr", "model.learning_rate"))
    assert cli.main(["docs", "--check", "--out", str(out)]) == 1
    assert "options.md" in capsys.readouterr().err


def option_rows() -> dict[str, dict]:
    return {row["option"]: row for row in docs.option_rows()}


def test_options_page_lists_every_backbone_option_once():
    page = (ROOT / "docs" / "reference" / "options.md").read_text()
    for field in fields(ModelConfig):
        assert page.count(f"| `model.{field.name}` |") == 1, field.name
    for key in ("model.lr", "data.name", "run.root", "trainer.max_epochs", "seed_everything"):
        assert page.count(f"| `{key}` |") == 1, key


def test_listed_family_choices_are_what_the_config_accepts():
    """Every pos_encoding and variant a family lists builds a config; another family's only is refused."""
    rows = option_rows()
    for option in ("pos_encoding", "variant"):
        listed = dict(part.split(": ") for part in rows[f"model.{option}"]["choices"].split("; "))
        for arch, names in listed.items():
            names = [n.strip("`") for n in names.split(", ")]
            for name in names:
                ModelConfig(arch=arch, **{option: name})
            for other in {n.strip("`") for v in listed.values() for n in v.split(", ")} - set(names):
                with pytest.raises(ValueError):
                    ModelConfig(arch=arch, **{option: other})


def test_family_and_encoding_scopes_are_enforced():
    """An option the page says one family (or some encodings) reads is refused elsewhere when set."""
    changed = {"depth": 2, "heads": 2, "mlp_dim": 32, "stem": "hybrid", "pos_injection": "every_layer",
               "hybrid_layers": (1,), "hybrid_width": 32, "reg_tokens": 1, "pos_embed_class": False,
               "relative_scale": "sqrt_d", "rope_theta": 50.0, "rope_coords": "normalized", "window_size": 4,
               "shift": False, "peg_padding": "circular",
               "pooling": "cls"}  # a shared option some families do not read (Family.reads)
    scoped = {k: v["applies to"] for k, v in option_rows().items() if v["applies to"]}
    assert {k.removeprefix("model.") for k in scoped} == set(changed)
    for key, scope in scoped.items():
        name = key.removeprefix("model.")
        for arch in set(FAMILIES) - {s.strip("`") for s in scope.split("; ")[0].split(", ")}:
            with pytest.raises(ValueError, match=name):
                ModelConfig(arch=arch, **{name: changed[name]})
        encodings = scope.split("; ")[1].split(", ") if "; " in scope else []
        for other in set(ENCODINGS) - {e.strip("`") for e in encodings} if encodings else ():
            with pytest.raises(ValueError, match=name):
                ModelConfig(arch="vit", pos_encoding=other, **{name: changed[name]})


def test_encoding_table_injections_are_what_the_vit_accepts():
    page = (ROOT / "docs" / "reference" / "encodings.md").read_text()
    for name in ENCODINGS:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
        listed = {i.strip("` ") for i in row.split(" | ")[2].split(",")}
        for injection in INJECTIONS:
            options = {"pos_encoding": name, "pos_injection": injection, "depth": 2, "heads": 4}
            if injection in listed:
                ModelConfig(**options)
            else:
                with pytest.raises(ValueError):
                    ModelConfig(**options)


def help_choices(help_text: str, option: str) -> set[str]:
    """The words after "Choices:" in one option's entry of `fit --help`."""
    block = next(b for b in help_text.split("\n  --") if b.startswith(option + " "))
    listed = " ".join(block.split()).split("Choices:", 1)[1].split("(type:")[0]
    return set(re.split(r"[\s,;:.]+", listed.strip(". ")))


def test_fit_help_lists_the_choices_the_registries_accept():
    from vit_lightning.commands.fit.cli import fit_parser
    from vit_lightning.data.datamodule import DATASETS
    from vit_lightning.model import POOLINGS

    text = fit_parser().format_help()
    encodings = help_choices(text, "model.pos_encoding")
    for family in FAMILIES.values():
        assert family.name in encodings and set(family.encodings) <= encodings
    assert set(DATASETS) <= help_choices(text, "data.name")
    assert set(POOLINGS) <= help_choices(text, "model.pooling")
    assert set(INJECTIONS) <= help_choices(text, "model.pos_injection")

"""Every committed table's records name the commit they were trained at, and results/README.md lists it, generated."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from vit_lightning.cli import main as cli
from vit_lightning.records import provenance
from vit_lightning.run.record import versions

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `(?P<folder>[^`]+)/` \| (?P<count>\d+) \| (?P<trained>.*) \|$", re.M)


def listed(page: str) -> dict[str, tuple[int, str]]:
    """The generated section's rows: folder -> (records, what it says they were trained at)."""
    body = page.split(provenance.BEGIN)[1].split(provenance.END)[0]
    return {m["folder"]: (int(m["count"]), m["trained"]) for m in ROW.finditer(body)}


def recorded(records: Path) -> dict[str, int]:
    """Each commit the folder's records name (their `versions.commit`, the first 7 digits) and how many name it."""
    out: dict[str, int] = {}
    for path in records.glob("*.json"):
        commit = json.loads(path.read_text()).get("versions", {}).get("commit")
        key = "not recorded" if commit is None else f"`{commit[:7]}`"
        out[key] = out.get(key, 0) + 1
    return out


def test_results_readme_lists_for_every_table_the_commit_its_records_name():
    rows = listed((ROOT / "results" / "README.md").read_text())
    tables = {str(p.parent.relative_to(ROOT / "results")) for p in (ROOT / "results").rglob("table.md")
              if (p.parent / "records").is_dir()}
    assert set(rows) == tables  # every committed table, and nothing else
    for folder, (count, trained) in rows.items():
        named = recorded(ROOT / "results" / folder / "records")
        assert count == sum(named.values())
        assert trained == "; ".join(f"{c} ({n})" for c, n in sorted(named.items(), key=lambda x: (-x[1], x[0])))


def _record(folder: Path, name: str, commit: str | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    versions_ = {"torch": "2"} | ({"commit": commit} if commit else {})
    (folder / f"{name}.json").write_text(json.dumps({"name": name, "versions": versions_}))


def test_docs_writes_the_section_and_check_fails_when_a_record_changes(tmp_path, capsys):
    results, a, b = tmp_path / "results", "a" * 40, "b" * 40
    for i in range(3):
        _record(results / "one" / "records", f"r{i}", a)
    for i, commit in enumerate([a, b + "+changes", b + "+changes", None]):
        _record(results / "one" / "more" / "records", f"r{i}", commit)
    (results / "one" / "table.md").write_text("t")
    (results / "one" / "more" / "table.md").write_text("t")
    (results / "README.md").write_text(f"intro\n\n{provenance.BEGIN}\nold\n{provenance.END}\n\nafter\n")
    out = ["docs", "--out", str(tmp_path / "reference"), "--results", str(results)]
    assert cli([*out, "--check"]) == 1 and "README.md" in capsys.readouterr().err
    assert cli(out) == 0
    page = (results / "README.md").read_text()
    assert page.startswith("intro\n\n") and page.endswith("\n\nafter\n") and "old" not in page
    assert listed(page) == {"one": (3, "`aaaaaaa` (3)"),
                            "one/more": (4, "`bbbbbbb` with uncommitted changes to the code (2); `aaaaaaa` (1); "
                                            "not recorded (1)")}
    assert cli([*out, "--check"]) == 0
    _record(results / "one" / "records", "r0", b)  # a record trained again at another commit
    assert cli([*out, "--check"]) == 1


def test_a_page_without_the_section_is_one_line(tmp_path, capsys):
    (tmp_path / "README.md").write_text("no section here\n")
    assert cli(["docs", "--out", str(ROOT / "docs" / "reference"), "--results", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vit-ablate docs: error: --results") and provenance.END in err and "\n" not in err


def test_a_run_record_names_the_commit_of_its_checkout():
    """versions() names HEAD, marked where the code (vit_lightning/, ablations/) differs from it, as git says."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "vit_lightning", "ablations"])
    untracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--others", "--exclude-standard", "--",
                                "vit_lightning", "ablations"], capture_output=True, text=True).stdout.strip()
    changed = dirty.returncode != 0 or bool(untracked)
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    assert versions()["commit"] == head + ("+changes" if changed else "")

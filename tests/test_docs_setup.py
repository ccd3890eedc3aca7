"""The documentation site opens with the README's set-up commands, and the README's three jobs run as its main
job does (the local backend, two trials at once on the CPU)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def section(text: str, heading: str) -> str:
    """The text under a `## heading`, up to the next `## `."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def bash_lines(text: str) -> list[str]:
    return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.strip().splitlines()]


def test_the_site_opens_with_the_readmes_set_up_commands():
    index = (ROOT / "docs" / "index.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert index.index("## Set up") < index.index("## Running ablations")  # first, before the site's pages
    assert bash_lines(section(index, "Set up")) == bash_lines(section(readme, "Set up"))
    assert "root of the vit-lightning repository" in index and "README.md" in index


def test_the_three_jobs_sweeps_use_the_main_jobs_backend():
    readme = (ROOT / "README.md").read_text()
    [main_job] = [line for line in bash_lines(section(readme, "Set up")) if "vit-ablate sweep" in line]
    assert "--backend local --parallel 2" in main_job
    sweeps = [shlex.split(line, comments=True) for line in bash_lines(section(readme, "The three jobs"))
              if line.startswith("vit-ablate sweep") and "--dry-run" not in line]
    assert len(sweeps) >= 4
    for words in sweeps:
        assert words[words.index("--backend") + 1] == "local", words
        if "--profile" not in words or words[words.index("--profile") + 1] in ("demo", "modern"):  # CPU profiles
            assert words[words.index("--parallel") + 1] == "2", words

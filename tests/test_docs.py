"""The documentation holds together: every "§n" the code and the docs cite is a section of docs/design.md, every
relative link in the README and docs/ reaches a file (and a heading, when it names one), and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 300

SECTION_REF = re.compile(r"§\s*(\d+)")
SECTION_HEADING = re.compile(r"^## §(\d+) \S", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The Markdown without fenced code blocks (whose lines are not headings, and hold no links)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (backticks and § included), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(_prose(path.read_text(encoding="utf-8"))):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def design_sections() -> list[int]:
    return [int(n) for n in SECTION_HEADING.findall(DESIGN.read_text(encoding="utf-8"))]


def citing_files() -> list[Path]:
    return sorted((ROOT / "t2s").rglob("*.py")) + [README, *DOCS]


def test_design_sections_are_numbered_in_order_once_each():
    sections = design_sections()
    assert sections, "docs/design.md has headings of the form '## §n Title'"
    assert sections == list(range(1, len(sections) + 1)), sections


@pytest.mark.parametrize("path", citing_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_section_reference_is_a_section_of_the_design(path):
    sections = set(design_sections())
    cited = {int(n) for n in SECTION_REF.findall(path.read_text(encoding="utf-8"))}
    assert cited <= sections, f"{path.relative_to(ROOT)} cites § {sorted(cited - sections)}, not in docs/design.md"


def test_the_code_cites_the_design():
    """The references the code makes are found at all (a guard against the pattern above matching nothing)."""
    cited = {n for path in (ROOT / "t2s").rglob("*.py") for n in SECTION_REF.findall(path.read_text(encoding="utf-8"))}
    assert len(cited) >= 5, cited


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    text = INLINE_CODE.sub("", _prose(path.read_text(encoding="utf-8")))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == [], f"{path.relative_to(ROOT)}: {broken}"


def test_every_doc_is_linked_from_the_readme():
    readme = README.read_text(encoding="utf-8")
    unlinked = [p.name for p in DOCS if f"](docs/{p.name}" not in readme]
    assert unlinked == []


def test_the_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the manual belongs in docs/"


def test_slug_matches_github():
    assert slug("§8 Training") == "8-training"
    assert slug("Converting a benchmark: `data convert`") == "converting-a-benchmark-data-convert"
    assert slug("The 9B sibling's table") == "the-9b-siblings-table"

"""Every relative link of README.md and docs/*.md points at a file or folder of the checkout, and the README
stays short enough to read top to bottom. The checker is tried on a planted broken link first, so a clean
result on the real documents means something."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 400
# [text](target) and ![alt](target); a target ends at whitespace (an optional "title" follows) or ")"
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
EXTERNAL = ("http://", "https://", "mailto:", "ftp://")


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """The relative link targets in one Markdown file that resolve to nothing on disk, as `file:line: target`.
    Anchors are stripped, external links skipped, code blocks and inline code not read as links."""
    text = doc.read_text()
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    text = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if target.startswith(EXTERNAL) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (root / path.lstrip("/")) if path.startswith("/") else (doc.parent / path)
        if not resolved.exists():
            line = text[:m.start()].count("\n") + 1
            out.append(f"{doc.relative_to(root)}:{line}: {target}")
    return out


def test_the_checker_reports_a_planted_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "there.md").write_text("x\n")
    (tmp_path / "docs" / "page.md").write_text(
        "[ok](../there.md#a) [web](https://example.com) [anchor](#top) ![img](../there.md)\n"
        "[gone](../missing.md) ![gone too](pics/none.png)\n"
        "`[code](not/a/link.md)`\n```\n[fenced](also/not.md)\n```\n")
    found = broken_links(tmp_path / "docs" / "page.md", tmp_path)
    assert found == ["docs/page.md:2: ../missing.md", "docs/page.md:2: pics/none.png"]


@pytest.mark.parametrize("doc", [p.relative_to(ROOT).as_posix() for p in documents()])
def test_every_relative_link_resolves(doc):
    assert broken_links(ROOT / doc) == []


def test_the_readme_is_at_most_400_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move detail to docs/"

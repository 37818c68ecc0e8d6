"""The front page is for learners: short, naming every chapter; what contributors need is one link away."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "CONTRIBUTING.md", "docs/chapters.md"]


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_readme_is_at_most_7_kb_and_names_every_chapter():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 7 * 1024, f"README.md is {len(readme.encode()):,} bytes"
    for chapter in sorted((REPO / "notebooks").glob("[0-9][0-9]*.ipynb")):
        assert f"](notebooks/{chapter.name})" in readme, f"the README does not name {chapter.stem}"
    for page in ("CONTRIBUTING.md", "docs/chapters.md", "LICENSE", "CITATION.cff"):
        assert f"]({page}" in readme, f"the README does not link {page}"


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_names_a_file_and_a_heading_that_exist(page):
    path = REPO / page
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md":
            headings = re.findall(r"(?m)^#+ (.+)$", re.sub(r"```.*?```", "", linked.read_text(encoding="utf-8"),
                                                           flags=re.S))
            if anchor not in {slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page}: links to nothing: {broken}"

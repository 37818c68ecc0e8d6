"""notebooks/glossary.md: every row complete in the three languages, every link to a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
GLOSSARY = NOTEBOOKS / "glossary.md"
# the terms the reader issue (#19) asks for, at least
REQUIRED = ["device", "context", "kernel", "stream", "synchronization", "pinned", "caching allocator",
            "mixed precision", "data parallelism", "all-reduce", "rank"]


def rows() -> list[list[str]]:
    """Return the glossary's table rows (header and rule rows left out) as lists of cells."""
    found = []
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        if line.startswith("|") and not line.startswith(("| English", "|---")):
            found.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return found


def test_every_row_has_the_three_languages_a_meaning_and_a_section():
    table = rows()
    assert len(table) >= 50
    assert all(len(row) == 5 and all(row) for row in table), [row for row in table if len(row) != 5 or not all(row)]
    # identifiers stay as they are (bfloat16, MPS); the other terms have Chinese characters
    chinese = [row for row in table if re.search(r"[\u4e00-\u9fff]", row[2])]
    assert len(chinese) >= 0.8 * len(table)


def test_the_required_terms_are_there():
    english = " ".join(row[0].lower() for row in rows())
    assert [term for term in REQUIRED if term not in english] == []


def test_every_link_points_at_a_notebook_of_the_course():
    links = re.findall(r"\]\(([^)#]+)", GLOSSARY.read_text(encoding="utf-8"))
    assert links
    assert [link for link in links if not (NOTEBOOKS / link).exists()] == []

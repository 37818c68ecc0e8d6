"""The contributor's guide stays a guide by task (issue 45 item 6): at most 12 KB, its sections in the order a
contributor meets them, no dated figures, and every link in it and in the pages it sends readers to resolves.

The machinery (the harness, the test cache, the matrix, CI) lives in docs/testing.md, and the modules of d2l_ext in
docs/layout.md; their links are checked the same way. A link is checked as GitHub renders it: a relative path
names a file or folder of the repository, and a ``#section`` names a heading of that file by GitHub's anchor rule.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "CONTRIBUTING.md"
CHECKED_PAGES = ["CONTRIBUTING.md", "docs/testing.md", "docs/layout.md"]
MAX_GUIDE_BYTES = 12 * 1024
# one section per task, in the order a contributor meets them (issue 45 item 6)
SECTIONS = [
    "Setting up",
    "Changing a notebook",
    "Writing a cell whose output holds on any machine",
    "Translating",
    "Running the checks",
    "On a GPU",
]
# what each task's section must tell, so that a reader finds it where the task is
SECTION_MUST_NAME = {
    "Setting up": ["make lab", "make test", "tools/envs/install.sh", "requirements-dev.txt", "make dev"],
    "Changing a notebook": ["make outputs", "tools.outputs.refresh", "tools.book.editions sync", "make test"],
    "Writing a cell whose output holds on any machine": [
        "tests/sanitize.cfg", "nbval-ignore-output", "device-dependent", "build-dependent", "exact", "tolerance"],
    "Translating": [f"tools.book.editions {command}" for command in ("sync", "status", "todo", "apply", "check")]
    + ["editions/terms/", "glossary.md"],
    "Running the checks": ["make test", '-m "not launches"', "make check-timing", "--twice", "make check-memory",
                           "CI_BUDGET_MINUTES", "NOT RUN", ".ci/run"],
    "On a GPU": ["make check-gpu", ".github/ISSUE_TEMPLATE/gpu-report.md"],
}
# a date (2026-11-27) or a measured duration ("3 min 20 s", "42 min"): a guide states rules, not a diary
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d+ min\b")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def without_code(text: str) -> str:
    """The text without fenced code blocks and inline code spans: neither holds links or headings."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation removed (hyphens and underscores kept), spaces to
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (or a notebook's markdown cells'), duplicates numbered as GitHub
    numbers them (``name``, ``name-1``, ``name-2``)."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = path.read_text(encoding="utf-8")
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"(?m)^#{1,6} +(.+?) *#*$", FENCE.sub("", text)):
        name = anchor(heading)
        found.add(name if name not in seen else f"{name}-{seen[name]}")
        seen[name] = seen.get(name, 0) + 1
    return found


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """The relative links of a markdown page that name no file, or a ``#section`` its target does not have."""
    broken = []
    for target in re.findall(r"\]\(<?([^)\s>]+)>?(?: +\"[^\"]*\")?\)", without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:: not a file of the repository
        file, _, section = target.partition("#")
        linked = (root / file.lstrip("/") if file.startswith("/") else page.parent / file) if file else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif section and linked.is_file() and linked.suffix in {".md", ".ipynb"}:
            if section not in anchors(linked):
                broken.append(f"{target} (no such section in {linked.name})")
        elif section:
            broken.append(f"{target} (a section of a file that has no headings)")
    return broken


def sections(text: str) -> list[str]:
    """The titles of a page's second-level headings, in order."""
    return re.findall(r"(?m)^## +(.+?) *$", FENCE.sub("", text))


def section_text(text: str, title: str) -> str:
    """One second-level section of a page, its subsections included."""
    found = re.search(rf"(?ms)^## +{re.escape(title)} *$(.*?)(?=^## |\Z)", text)
    return found[1] if found else ""


def test_the_guide_is_at_most_12_kb():
    size = len(GUIDE.read_bytes())
    assert size <= MAX_GUIDE_BYTES, (f"CONTRIBUTING.md is {size:,} bytes, over {MAX_GUIDE_BYTES:,}: move the "
                                     "machinery to docs/testing.md or docs/layout.md")


def test_the_guide_has_one_section_per_task_in_order():
    found = sections(GUIDE.read_text(encoding="utf-8"))
    assert found == SECTIONS, f"CONTRIBUTING.md's sections are {found}; they must be {SECTIONS}, in this order"


@pytest.mark.parametrize("title", SECTIONS)
def test_each_task_section_names_what_the_task_needs(title):
    text = section_text(GUIDE.read_text(encoding="utf-8"), title)
    missing = [name for name in SECTION_MUST_NAME[title] if name not in text]
    assert not missing, f"CONTRIBUTING.md, section {title!r}, does not name {missing}"


@pytest.mark.parametrize("page", ["CONTRIBUTING.md", "docs/testing.md"])
def test_no_dated_figures(page):
    text = (REPO / page).read_text(encoding="utf-8")
    dated = [line.strip() for line in text.splitlines() if DATED.search(line)]
    assert not dated, f"{page} keeps dated figures or measured run times (state the rule instead): {dated}"


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_every_link_names_a_file_and_a_section_that_exist(page):
    assert (REPO / page).exists(), f"{page} is missing"
    broken = broken_links(REPO / page)
    assert not broken, f"{page} links to nothing: {broken}"


def test_the_guide_links_the_pages_its_machinery_moved_to():
    text = GUIDE.read_text(encoding="utf-8")
    for page in ("docs/testing.md", "docs/layout.md"):
        assert f"]({page}" in text, f"CONTRIBUTING.md does not link {page}"


# the checks above can fail: each is run here on a page made to break it


def test_a_broken_file_link_and_a_missing_section_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Binder's memory: 2 GiB\n\n## Notes\n\n## Notes\n")
    cells = [{"cell_type": "markdown", "source": ["## A cell's title"]}]
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": cells}))
    page = tmp_path / "GUIDE.md"
    page.write_text(
        "# Guide\n\n## Running the checks\n\n"
        "[ok](docs/other.md#binders-memory-2-gib) [ok](docs/other.md#notes-1) [ok](#running-the-checks) "
        "[ok](nb.ipynb#a-cells-title) [ok](docs/) [ok](https://example.com/nothing.md)\n"
        "[gone](docs/missing.md) [no section](docs/other.md#binder-memory) [third](docs/other.md#notes-2) "
        "[here](#run-the-checks) [root](/docs/other.md#other) [root gone](/other.md)\n"
        "`[in code](docs/missing-too.md)`\n\n```\n[in a block](docs/missing-three.md)\n```\n")
    assert broken_links(page, tmp_path) == [
        "docs/missing.md (no such file)",
        "docs/other.md#binder-memory (no such section in other.md)",
        "docs/other.md#notes-2 (no such section in other.md)",
        "#run-the-checks (no such section in GUIDE.md)",
        "/other.md (no such file)",
    ]


def test_anchors_follow_githubs_rule():
    assert anchor("Writing a cell whose output holds") == "writing-a-cell-whose-output-holds"
    assert anchor("Memory: what each notebook needs") == "memory-what-each-notebook-needs"
    assert anchor("The `make test` run, in 3 parts (fast)") == "the-make-test-run-in-3-parts-fast"
    assert anchor("Read [the guide](x.md) first") == "read-the-guide-first"


def test_sections_out_of_order_and_a_dated_figure_are_found():
    swapped = "# Guide\n" + "".join(f"## {title}\n\ntext\n\n" for title in [SECTIONS[1], SECTIONS[0], *SECTIONS[2:]])
    assert sections(swapped) != SECTIONS
    assert sections("# Guide\n" + "".join(f"## {title}\n\n```\n## not a section\n```\n" for title in SECTIONS)) \
        == SECTIONS
    assert DATED.search("It takes 3 min 20 s on a quiet machine (measured on 2026-11-26).")
    assert DATED.search("42 min from a fresh clone")
    assert not DATED.search("Its budget is `CI_BUDGET_MINUTES` (default 60), a minute below 300 s, 60 minutes")

"""tools/book/build.py without Sphinx: what it feeds the build (make book builds it; make check-book opens it)."""

from __future__ import annotations

import re

import nbformat
import pytest

from tools.book import build, editions


def test_the_front_page_is_the_readmes_chapter_table_pointing_at_pages():
    table = build.chapter_table((build.ROOT / "README.md").read_text())
    rows = table.splitlines()
    chapters = sorted(p.stem for p in (build.ROOT / "notebooks").glob("[0-9][0-9]*.ipynb"))
    assert rows[0].startswith("| Notebook |") and len(rows) == 2 + len(chapters)
    for chapter in chapters:
        assert f"[{chapter}]({chapter}.ipynb)" in table
    assert "notebooks/" not in table
    with pytest.raises(ValueError, match="no '## Chapters'"):
        build.chapter_table("# a README without chapters")


# a letter that only Vietnamese writes (đ, ư, ơ, ă, or a vowel with a tone mark), and a Chinese character
OWN_SCRIPT = {"vi": r"[đươăạảấầẩẫậắằẳẵặẹẻẽếềểễệỉịọỏốồổỗộớờởỡợụủứừửữựỳỵỷỹ]", "zh-CN": r"[\u4e00-\u9fff]"}


@pytest.mark.parametrize("edition", list(editions.LANGUAGES))
def test_each_edition_opens_on_a_chapter_table_in_its_own_language(edition):
    readme = (build.ROOT / "README.md").read_text()
    chapters, solutions = build.pages(build.ROOT / "notebooks")
    page = build.front_page(edition, chapters, solutions, readme)
    english = build.chapter_table(readme).splitlines()
    table = [line for line in page.splitlines() if line.startswith("|")]
    assert len(table) == len(english) == 2 + len(chapters)
    assert table[0] != english[0], f"the {edition} front page's chapter table has the English header"
    for row, source in zip(table[2:], english[2:], strict=True):
        cells, english_cells = (r.strip("|").split(" | ") for r in (row, source))
        assert cells[0] == english_cells[0]  # the same notebook, linked to its page
        for cell, english_cell in zip(cells[1:], english_cells[1:], strict=True):
            assert cell != english_cell and re.search(OWN_SCRIPT[edition], cell), (edition, cell)
    assert build.table_problems(edition, readme) == []


def test_a_stale_or_english_chapter_table_is_named(tmp_path, monkeypatch):
    readme = (build.ROOT / "README.md").read_text()
    english = build.readme_table(readme)
    monkeypatch.setattr(build, "TABLES", tmp_path)
    stamp = f"<!-- translated from README.md's chapter table, source_sha: {editions.source_sha(english)} -->"
    (tmp_path / "vi.md").write_text(f"{stamp}\n{english}\n", encoding="utf-8")
    found = build.table_problems("vi", readme)
    assert found and all(" in English " in line for line in found)
    assert found[0] == "tools/book/front/vi.md row Notebook: in English (a cell is the README's text)"
    assert len(found) == 1 + len(build.pages(build.ROOT / "notebooks")[0])  # the header and every chapter's row
    changed = readme.replace("| runs; GPU cells skip |", "| runs; the GPU cells skip |")
    assert "tools/book/front/vi.md: stale (the README's chapter table changed since it was translated)" in \
        build.table_problems("vi", changed)
    assert build.table_problems("zh-CN", readme) == ["tools/book/front/zh-CN.md: missing (a translation of the "
                                                     "README's chapter table)"]


def test_too_old_a_python_stops_with_one_line_saying_what_to_run():
    with pytest.raises(SystemExit, match=r"needs Python 3.11 or newer \(this is 3.10\): run  make book BOOK_PYTHON"):
        build.check_python((3, 10))
    build.check_python((3, 11))


@pytest.mark.parametrize("edition", list(build.EDITIONS))
def test_each_edition_renders_stored_outputs_with_its_own_buttons(edition):
    conf = build.conf_py(edition)
    namespace: dict = {}
    exec(conf, namespace)  # the file Sphinx reads
    assert namespace["nb_execution_mode"] == "off"
    options = namespace["html_theme_options"]
    assert options["path_to_docs"] == build.EDITIONS[edition][1]
    assert set(options["launch_buttons"]) >= {"colab_url", "binderhub_url"} and options["use_download_button"]
    assert "languages.html" in namespace["html_sidebars"]["**"]
    # $...$ is math, typeset by the copy of MathJax in _static (copy_mathjax), not by one from the network
    assert "dollarmath" in namespace["myst_enable_extensions"]
    assert namespace["mathjax_path"] == "mathjax/tex-chtml.js" and namespace["html_static_path"] == ["_static"]
    assert build.MATHJAX_FILES[0] == namespace["mathjax_path"].split("/", 1)[1]


def test_without_mathjax_the_build_stops_saying_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(build.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="MathJax is missing \\(sphinx-mathjax-offline\\): run  make book"):
        build.copy_mathjax(tmp_path / "mathjax")


def test_the_language_switch_links_the_same_page_in_every_other_edition():
    template = build.languages_template("vi")
    assert '/../en/{{ pagename }}.html">English' in template and '/../zh-CN/{{ pagename }}.html">中文' in template
    assert "<strong>Tiếng Việt</strong>" in template


def test_the_source_folder_holds_every_page_without_the_colab_cells(tmp_path):
    build.prepare("en", tmp_path / "en")
    chapters, solutions = build.pages(build.ROOT / "notebooks")
    assert len(chapters) >= 9 and len(solutions) == len(chapters)
    for page in chapters + solutions:
        notebook = nbformat.read(tmp_path / "en" / f"{page}.ipynb", as_version=4)
        removed = [c.id for c in notebook.cells if "remove-cell" in c.metadata.get("tags", [])]
        assert removed == ["colab-badge", "colab-setup"], page
    index = (tmp_path / "en" / "index.md").read_text()
    assert index.index("01_devices\n") < index.index("08_memory\n") < index.index("solutions/01_devices\n")
    assert "glossary" in index and (tmp_path / "en" / "scripts" / "zero1.py").exists()


def test_every_edition_has_the_same_pages():
    english = build.pages(build.ROOT / "notebooks")
    for language in editions.LANGUAGES:
        assert build.pages(editions.EDITIONS / language) == english, language

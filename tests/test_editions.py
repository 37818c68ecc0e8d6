"""The Vietnamese and Chinese editions: paired cell by cell with the English notebooks (tools/book/editions.py).

Kernel-free. The first test holds the real editions (notebooks and glossaries) to the rules; the others plant each
kind of divergence in a copy and check that it is found, named by notebook and cell: code that differs beyond its
comments, translated comments that are stale or unrecorded, a glossary row that is not the English one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from tools.book import editions

NOTEBOOKS = editions.english_notebooks()
REPO = editions.REPO


@pytest.mark.parametrize("language", list(editions.LANGUAGES))
def test_every_edition_is_in_step_with_english(language):
    found = [line for relative in NOTEBOOKS for line in editions.problems(language, relative)]
    found += editions.glossary_problems(language)
    assert found == [], f"{len(found)} problems, the first: {found[:5]} (python -m tools.book.editions status)"


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A copy of two English notebooks and their Vietnamese edition, made by sync."""
    for relative in (Path("01_devices.ipynb"), Path("solutions/01_devices.ipynb")):
        (tmp_path / "notebooks" / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(editions.NOTEBOOKS / relative, tmp_path / "notebooks" / relative)
    monkeypatch.setattr(editions, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(editions, "EDITIONS", tmp_path / "editions")
    relative = Path("01_devices.ipynb")
    editions.sync("vi", relative)
    translations = {cell_id: f"(vi) {text}" for cell_id, text in editions.todo("vi", relative).items()}
    editions.apply("vi", relative, translations)
    return tmp_path, relative


def edit(path: Path, change) -> None:
    notebook = nbformat.read(path, as_version=4)
    change(notebook)
    nbformat.write(notebook, path)


def first(notebook, cell_type, skip_setup=True):
    return next(c for c in notebook.cells if c.cell_type == cell_type and (c.id != "colab-setup" or not skip_setup))


def test_a_translated_edition_passes_and_a_new_one_lists_every_prose_cell(course):
    root, relative = course
    assert editions.problems("vi", relative) == []
    editions.sync("vi", Path("solutions/01_devices.ipynb"))
    untranslated = editions.problems("vi", Path("solutions/01_devices.ipynb"))
    english = nbformat.read(root / "notebooks/solutions/01_devices.ipynb", as_version=4)
    prose = [c for c in english.cells if c.cell_type == "markdown" and c.id != "colab-badge"]
    assert len(untranslated) == len(prose) and all("not translated" in line for line in untranslated)


def test_the_colab_cells_point_at_the_edition(course):
    root, relative = course
    edition = nbformat.read(root / "editions/vi" / relative, as_version=4)
    cells = {c.id: c.source for c in edition.cells}
    assert "blob/main/editions/vi/01_devices.ipynb" in cells["colab-badge"]
    assert "%cd /content/course/editions/vi\n" in cells["colab-setup"]


def test_a_changed_code_cell_is_named(course):
    root, relative = course
    edit(root / "editions/vi" / relative, lambda nb: setattr(first(nb, "code"), "source",
                                                             first(nb, "code").source + "\nx = 1"))
    cell = first(nbformat.read(root / "notebooks" / relative, as_version=4), "code").id
    assert editions.problems("vi", relative) == [f"editions/vi/01_devices.ipynb cell {cell}: code differs from the "
                                                 "English cell (only comments may be translated)"]


def commented_cell(notebook):
    """The first code cell (Colab's setup left out) with a comment line of its own."""
    return next(c for c in notebook.cells if c.cell_type == "code" and c.id != "colab-setup"
                and any(line.lstrip().startswith("#") for line in c.source.splitlines()))


def with_comments(source: str, text: str) -> str:
    """Return ``source`` with each comment replaced by ``text`` (and a longer comment wrapped onto a second line)."""
    lines = []
    for line in source.splitlines():
        if line.lstrip().startswith("#"):
            indent = line[:len(line) - len(line.lstrip())]
            lines += [f"{indent}# {text}", f"{indent}# (tiếp)"]
        else:
            lines.append(line)
    return "\n".join(lines)


def test_a_translated_comment_is_allowed_and_recorded(course):
    root, relative = course
    cell = commented_cell(nbformat.read(root / "editions/vi" / relative, as_version=4))
    english_comments = editions.english_comment_lines("vi", relative)
    assert editions.apply("vi", relative, {cell.id: with_comments(cell.source, "(vi) chú thích")}) == 1
    translated = next(c for c in nbformat.read(root / "editions/vi" / relative, as_version=4).cells if c.id == cell.id)
    assert "# (vi) chú thích" in translated.source
    assert translated.metadata["i18n"] == {"source_sha": editions.source_sha(cell.source)}
    assert editions.problems("vi", relative) == []
    assert editions.english_comment_lines("vi", relative) == english_comments - len(editions.comments(cell.source))


def test_comments_translated_by_hand_without_a_hash_are_named(course):
    root, relative = course
    found = {}

    def translate(notebook):
        cell = commented_cell(notebook)
        found["id"] = cell.id
        cell.source = with_comments(cell.source, "(vi) chú thích")

    edit(root / "editions/vi" / relative, translate)
    assert editions.problems("vi", relative) == [
        f"editions/vi/01_devices.ipynb cell {found['id']}: comments or layout differ from the English cell without "
        "i18n.source_sha (run sync, or record translated comments with apply)"]
    assert list(editions.todo("vi", relative)) == [found["id"]]  # apply records them


def test_sync_gives_an_untranslated_cell_the_english_layout(course):
    root, relative = course
    cell = commented_cell(nbformat.read(root / "editions/vi" / relative, as_version=4))
    relaid = cell.source.replace("\n", "\n\n", 1)  # a blank line more: the same tokens

    edit(root / "notebooks" / relative, lambda nb: setattr(next(c for c in nb.cells if c.id == cell.id), "source",
                                                           relaid))
    editions.sync("vi", relative)
    synced = next(c for c in nbformat.read(root / "editions/vi" / relative, as_version=4).cells if c.id == cell.id)
    assert synced.source == relaid and editions.problems("vi", relative) == []


@pytest.mark.parametrize("change", [
    lambda source: source + "\nx = 1  # (vi) một dòng mới",         # a line of code beside a comment
    lambda source: source.replace("(", "( ", 1).replace("# ", "## ", 1) + '\nprint("# không phải chú thích")',
    lambda source: "\n".join(line.split("#")[0].rstrip() + "  # (vi)" if "#" in line else "    " + line
                             for line in source.splitlines()),  # indentation changed
])
def test_code_that_differs_beyond_comments_is_refused(course, change):
    root, relative = course
    cell = commented_cell(nbformat.read(root / "editions/vi" / relative, as_version=4))
    with pytest.raises(SystemExit, match=f"cell {cell.id}: the translation changes the code, not only comments"):
        editions.apply("vi", relative, {cell.id: change(cell.source)})
    edit(root / "editions/vi" / relative,
         lambda nb: setattr(next(c for c in nb.cells if c.id == cell.id), "source", change(cell.source)))
    assert editions.problems("vi", relative) == [f"editions/vi/01_devices.ipynb cell {cell.id}: code differs from "
                                                 "the English cell (only comments may be translated)"]


def test_a_changed_shell_line_is_code_not_a_comment(course):
    assert editions.code_tokens("!nvidia-smi  # GPUs") != editions.code_tokens("!nvidia-smi  # GPU")
    assert editions.code_tokens("x = 1  # one\n# two\ny = x") == editions.code_tokens("x = 1  # một\n\ny = x")
    assert editions.code_tokens("if x:\n    y = 1\n") != editions.code_tokens("if x:\n    y = 1\nz = 2\n")
    assert editions.comments("!ls  # x\nx = 1  # một\n") == ["# một"]
    directive = "x.y  # pyright: ignore[reportOptionalMemberAccess] (x is set)"
    assert editions.code_tokens(directive) != editions.code_tokens("x.y  # pyright: bỏ qua")  # tools read it


def test_sync_keeps_translated_comments_while_the_english_code_is_the_same(course):
    root, relative = course
    cell = commented_cell(nbformat.read(root / "editions/vi" / relative, as_version=4))
    editions.apply("vi", relative, {cell.id: with_comments(cell.source, "(vi) chú thích")})

    def english_comment(notebook, text):
        english = next(c for c in notebook.cells if c.id == cell.id)
        english.source = english.source.replace("# ", f"# {text} ", 1)

    edit(root / "notebooks" / relative, lambda nb: english_comment(nb, "reworded"))
    reset: list[str] = []
    editions.sync("vi", relative, reset)
    kept = next(c for c in nbformat.read(root / "editions/vi" / relative, as_version=4).cells if c.id == cell.id)
    assert reset == [] and "# (vi) chú thích" in kept.source
    assert editions.problems("vi", relative) == [
        f"editions/vi/01_devices.ipynb cell {cell.id}: comments stale (the English code changed since they were "
        "translated)"]
    todo = editions.todo("vi", relative)
    assert list(todo) == [cell.id] and "# reworded" in todo[cell.id]
    editions.apply("vi", relative, {cell.id: with_comments(todo[cell.id], "(vi) chú thích mới")})
    assert editions.problems("vi", relative) == []

    def change_code(notebook):
        english = next(c for c in notebook.cells if c.id == cell.id)
        english.source += "\nx = 2"

    edit(root / "notebooks" / relative, change_code)
    editions.sync("vi", relative, reset)
    replaced = next(c for c in nbformat.read(root / "editions/vi" / relative, as_version=4).cells if c.id == cell.id)
    assert reset == [cell.id] and "(vi)" not in replaced.source and replaced.source.endswith("x = 2")
    assert "i18n" not in replaced.metadata and editions.problems("vi", relative) == []


def test_changed_outputs_are_named(course):
    root, relative = course
    edit(root / "editions/vi" / relative,
         lambda nb: next(c for c in nb.cells if c.cell_type == "code" and c.outputs).outputs.clear())
    assert [line.split(": ", 1)[1] for line in editions.problems("vi", relative)] == [
        "outputs differ from the English cell"]


def test_a_missing_and_an_extra_cell_are_named(course):
    root, relative = course
    removed = {}

    def drop_and_add(notebook):
        removed["id"] = notebook.cells[3].id
        del notebook.cells[3]
        notebook.cells.append(nbformat.v4.new_markdown_cell("extra", id="not-in-english"))

    edit(root / "editions/vi" / relative, drop_and_add)
    assert editions.problems("vi", relative) == [
        f"editions/vi/01_devices.ipynb cell {removed['id']}: missing",
        "editions/vi/01_devices.ipynb cell not-in-english: extra (no English cell has this id)"]


def test_an_english_change_makes_the_translation_stale_and_apply_fixes_it(course):
    root, relative = course
    changed = {}

    def reword(notebook):
        cell = next(c for c in notebook.cells if c.cell_type == "markdown" and c.id != "colab-badge")
        changed["id"] = cell.id
        cell.source += " One more sentence."

    edit(root / "notebooks" / relative, reword)
    assert editions.problems("vi", relative) == [
        f"editions/vi/01_devices.ipynb cell {changed['id']}: stale (the English text changed since it was translated)"]
    assert list(editions.todo("vi", relative)) == [changed["id"]]
    editions.sync("vi", relative)  # sync keeps the stale translation: it does not undo a translator's work
    assert len(editions.problems("vi", relative)) == 1
    editions.apply("vi", relative, {changed["id"]: "(vi) bản dịch mới"})
    assert editions.problems("vi", relative) == []


def test_english_text_left_in_place_is_not_a_translation(course):
    root, relative = course
    english = {c.id: c.source for c in nbformat.read(root / "notebooks" / relative, as_version=4).cells}

    def untranslate(notebook):
        cell = next(c for c in notebook.cells if c.cell_type == "markdown" and c.id != "colab-badge")
        cell.source = english[cell.id]

    edit(root / "editions/vi" / relative, untranslate)
    assert [line.split(": ", 1)[1] for line in editions.problems("vi", relative)] == [
        "not translated (the English text, without same_as_source)"]


def test_the_command_line_lists_what_needs_translating(course, capsys):
    _, relative = course
    editions.sync("vi", Path("solutions/01_devices.ipynb"))
    assert editions.main(["todo", "vi", "solutions/01_devices.ipynb"]) == 0
    assert len(json.loads(capsys.readouterr().out)) > 0
    assert editions.main(["check", "vi"]) == 1  # the solutions are not translated yet
    with pytest.raises(SystemExit, match="unknown language"):
        editions.main(["check", "xx"])


def test_a_file_that_is_not_a_notebook_is_named(course):
    root, relative = course
    (root / "editions/vi" / relative).write_text('{"cells": [', encoding="utf-8")
    [line] = editions.problems("vi", relative)
    assert line.startswith("editions/vi/01_devices.ipynb: not a readable notebook (")


@pytest.fixture
def glossaries(tmp_path, monkeypatch):
    """A copy of the English glossary and the Vietnamese one."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "editions/vi").mkdir(parents=True)
    shutil.copyfile(editions.NOTEBOOKS / "glossary.md", tmp_path / "notebooks/glossary.md")
    shutil.copyfile(editions.EDITIONS / "vi/glossary.md", tmp_path / "editions/vi/glossary.md")
    monkeypatch.setattr(editions, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(editions, "EDITIONS", tmp_path / "editions")
    assert editions.glossary_problems("vi") == []
    return tmp_path / "notebooks/glossary.md", tmp_path / "editions/vi/glossary.md"


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_each_edition_has_its_own_translated_glossary():
    for language in editions.LANGUAGES:
        path = editions.EDITIONS / language / "glossary.md"
        assert path.is_file() and not path.is_symlink()
        english = editions.glossary_rows((editions.NOTEBOOKS / "glossary.md").read_text(encoding="utf-8"))
        ours = editions.glossary_rows(path.read_text(encoding="utf-8"))
        assert [row[:3] for row in ours] == [row[:3] for row in english]
        assert not {row[3] for row in ours} & {row[3] for row in english}  # every meaning translated
        assert "Glossary" not in path.read_text(encoding="utf-8").splitlines()[1]  # the title (the book's label)


def test_a_glossary_row_that_is_not_the_english_one_is_named(glossaries):
    _, ours = glossaries
    replace_in(ours, "| bộ nhớ ghim, bộ nhớ khóa trang (pinned) |", "| bộ nhớ ghim |")
    replace_in(ours, "Số byte mà các tensor còn sống đang dùng", "Bytes used by live tensors")  # the English
    assert editions.glossary_problems("vi") == [
        "editions/vi/glossary.md row allocated memory: the meaning is not translated",
        "editions/vi/glossary.md row pinned (page-locked) memory: its terms or sections differ from the English row"]


def test_a_changed_english_glossary_makes_the_translation_stale(glossaries):
    english, ours = glossaries
    replace_in(english, "| thread | luồng | 线程 |", "| thread | luồng | 线程（thread） |")
    assert editions.glossary_problems("vi") == [
        "editions/vi/glossary.md: stale (notebooks/glossary.md changed since it was translated)",
        "editions/vi/glossary.md row thread: its terms or sections differ from the English row"]
    ours.unlink()
    ours.symlink_to(english)
    assert editions.glossary_problems("vi") == [
        "editions/vi/glossary.md: missing (a translation of notebooks/glossary.md, not a link)"]


def test_links_into_the_glossary_name_its_own_headings(course):
    root, relative = course
    shutil.copyfile(REPO / "notebooks/glossary.md", root / "notebooks/glossary.md")
    shutil.copyfile(REPO / "editions/vi/glossary.md", root / "editions/vi/glossary.md")
    english = next(c for c in nbformat.read(root / "notebooks" / relative, as_version=4).cells
                   if c.cell_type == "markdown" and c.id != "colab-badge")
    editions.apply("vi", relative, {english.id: "(vi) [bảng thuật ngữ](glossary.md#copies)"})
    cell = next(c for c in nbformat.read(root / "editions/vi" / relative, as_version=4).cells if c.id == english.id)
    assert cell.source == "(vi) [bảng thuật ngữ](glossary.md#sao-chép)"  # the English anchor, made the edition's
    assert editions.problems("vi", relative) == []
    edit(root / "editions/vi" / relative, lambda nb: setattr(
        next(c for c in nb.cells if c.id == english.id), "source", "(vi) [bảng](glossary.md#khong-co)"))
    assert editions.problems("vi", relative) == [
        f"editions/vi/01_devices.ipynb cell {english.id}: links glossary.md#khong-co, a heading that "
        "editions/vi/glossary.md does not have"]


def test_a_shell_line_continued_with_a_backslash_is_read_as_ipython_reads_it():
    # the Colab setup cell's git clone, split to fit the book's column: its second line is not Python
    cell = ('if True:\n    # fetch\n    !git clone a \\\n        https://b /c\n    # then load\n'
            '    from d2l_ext.compat import torch_check\n')
    assert editions.comments(cell) == ["# fetch", "# then load"]
    assert (0, "https://b /c") in editions.code_tokens(cell)
    changed = cell.replace("https://b", "https://x")
    assert editions.code_tokens(changed) != editions.code_tokens(cell)  # the continued line is code


def test_todo_and_apply_name_a_notebook_that_is_not_there(course):
    with pytest.raises(SystemExit, match=r"no notebook notebooks/01_devices: name it as it lies under notebooks/"):
        editions.main(["todo", "vi", "01_devices"])  # the name without .ipynb
    with pytest.raises(SystemExit, match=r"unknown language \['xx'\]"):
        editions.main(["apply", "xx", "01_devices.ipynb", "translations.json"])
    assert editions.main(["todo", "vi"]) == 2  # the notebook left out: the usage

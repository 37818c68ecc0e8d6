"""The Vietnamese and Chinese editions: paired cell by cell with the English notebooks (tools/editions.py).

Kernel-free. The first test holds the real editions to the rules; the others plant each kind of divergence in a
copy and check that it is found, named by notebook and cell.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from tools import editions

NOTEBOOKS = editions.english_notebooks()


@pytest.mark.parametrize("language", list(editions.LANGUAGES))
def test_every_edition_is_in_step_with_english(language):
    found = [line for relative in NOTEBOOKS for line in editions.problems(language, relative)]
    assert found == [], f"{len(found)} problems, the first: {found[:5]} (python tools/editions.py status)"


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


def test_a_translated_comment_is_allowed(course):
    root, relative = course

    def translate_comment(notebook):
        cell = next(c for c in notebook.cells if c.cell_type == "code" and "#" in c.source and c.id != "colab-setup")
        cell.source = "\n".join(line.split("#")[0] + "# (vi) chú thích" if "#" in line else line
                                for line in cell.source.splitlines())

    edit(root / "editions/vi" / relative, translate_comment)
    assert editions.problems("vi", relative) == []


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

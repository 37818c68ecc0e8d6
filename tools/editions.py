"""The course in Vietnamese and Chinese: edition notebooks paired cell by cell with the English ones.

English (``notebooks/``) is the one source of code and outputs. An edition (``editions/vi/``, ``editions/zh-CN/``)
holds the same notebooks under the same names, with the same cells in the same order, matched on cell ids:

- a code cell is the English cell: the same source (its comments may be translated), outputs and metadata;
- a markdown cell holds the translation, and records in ``metadata.i18n.source_sha`` the hash of the English
  text it was made from. When the English text changes, the hash no longer matches: the translation is *stale*.
  A cell whose English text is also right in the edition (a formula, a badge) says ``same_as_source: true``.

Commands (``python tools/editions.py COMMAND``):

- ``sync [LANG ...]``: write each edition notebook from the English one. Code cells, outputs and notebook metadata
  are copied; a markdown cell keeps its translation and hash; a new one gets the English text and no hash (so it
  is listed as untranslated). ``scripts/`` and ``glossary.md`` are links to the English ones.
- ``status [LANG ...]``: a table per notebook: translated, stale, untranslated cells.
- ``todo LANG NOTEBOOK``: the markdown cells that need translating, as JSON ``{cell id: English text}``: the file
  a translator fills in.
- ``apply LANG NOTEBOOK FILE``: put the translations of FILE (JSON ``{cell id: text}``) into the edition and record
  the current English hash of each.
- ``check [LANG ...]``: exit status 1 and one line per problem (notebook and cell named) if an edition diverges.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import sys
import tokenize
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
EDITIONS = REPO / "editions"
LANGUAGES = {"vi": "Tiếng Việt", "zh-CN": "中文"}
LINKED = ("scripts", "glossary.md")  # shared with the English notebooks, as symbolic links
SETUP_TAG = "colab-setup"


def english_notebooks() -> list[Path]:
    """Return the English notebooks, relative to ``notebooks/`` (chapters, then solutions)."""
    found = [p.relative_to(NOTEBOOKS) for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts]
    return sorted(found, key=lambda p: (len(p.parts), str(p)))


def source_sha(text: str) -> str:
    """Return the hash that a translation records of the English text it was made from."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def edition_path(language: str, relative: Path) -> Path:
    return EDITIONS / language / relative


def _colab_path(relative: Path, language: str | None) -> str:
    folder = f"editions/{language}" if language else "notebooks"
    return f"{folder}/{relative.as_posix()}"


def edition_code(source: str, relative: Path, language: str) -> str:
    """Return an English code cell's source as the edition holds it: the Colab setup cell opens the edition's
    folder; every other cell is unchanged."""
    english_dir = "/content/course/" + _colab_path(relative.parent, None).rstrip("/.")
    edition_dir = "/content/course/" + _colab_path(relative.parent, language).rstrip("/.")
    return source.replace(f"%cd {english_dir}\n", f"%cd {edition_dir}\n")


def edition_markdown_default(source: str, relative: Path, language: str) -> tuple[str, bool]:
    """Return the text a new edition cell starts with, and whether it is already right (the Colab badge)."""
    english = _colab_path(relative, None)
    if "colab-badge.svg" in source and english in source:
        return source.replace(english, _colab_path(relative, language)), True
    return source, False


def code_tokens(source: str) -> list[tuple[int, str]]:
    """Return the tokens of a code cell without comments and blank lines (IPython's ! and % lines kept as text)."""
    lines = ["pass  # " + line if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines()]
    try:
        tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
        skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
        kept = [(t.type, t.string) for t in tokens if t.type not in skip]
    except (tokenize.TokenError, SyntaxError):
        return [(0, source)]
    magics = [(0, line.strip()) for line in source.splitlines() if line.lstrip().startswith(("!", "%"))]
    return kept + magics


def sync(language: str, relative: Path) -> nbformat.NotebookNode:
    """Write the edition of ``relative`` in ``language`` from the English notebook, keeping translations."""
    english = nbformat.read(NOTEBOOKS / relative, as_version=4)
    target = edition_path(language, relative)
    old = {c.id: c for c in nbformat.read(target, as_version=4).cells} if target.exists() else {}
    cells = []
    for cell in english.cells:
        if cell.cell_type != "markdown":
            new = copy.deepcopy(cell)
            new.source = edition_code(cell.source, relative, language)
            cells.append(new)
            continue
        previous = old.get(cell.id)
        if previous is not None and previous.cell_type == "markdown" and "i18n" in previous.metadata:
            new = copy.deepcopy(cell)
            new.source, new.metadata["i18n"] = previous.source, previous.metadata["i18n"]
        else:
            new = copy.deepcopy(cell)
            text, same = edition_markdown_default(cell.source, relative, language)
            new.source = text
            new.metadata["i18n"] = {"source_sha": source_sha(cell.source), "same_as_source": True} if same else {}
        cells.append(new)
    notebook = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(english.metadata))
    notebook.nbformat, notebook.nbformat_minor = english.nbformat, english.nbformat_minor
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return notebook


def link_shared(language: str) -> None:
    """Make ``scripts/`` and ``glossary.md`` in the edition links to the English ones."""
    root = EDITIONS / language
    for name in LINKED:
        link = root / name
        if not link.is_symlink():
            if link.exists():
                raise SystemExit(f"{link} exists and is not a link: remove it, the edition shares the English one")
            link.symlink_to(Path("..", "..", "notebooks", name))


def problems(language: str, relative: Path) -> list[str]:
    """Return what is wrong with the edition of ``relative``: one line per problem, the notebook and cell named."""
    name = f"editions/{language}/{relative.as_posix()}"
    target = edition_path(language, relative)
    if not target.exists():
        return [f"{name}: missing (run: python tools/editions.py sync {language})"]
    english = nbformat.read(NOTEBOOKS / relative, as_version=4)
    try:
        edition = nbformat.read(target, as_version=4)
    except Exception as err:  # not JSON, or not a notebook
        return [f"{name}: not a readable notebook ({type(err).__name__}: {str(err).splitlines()[0][:200]})"]
    found: list[str] = []
    english_ids, edition_ids = [c.id for c in english.cells], [c.id for c in edition.cells]
    for missing in [i for i in english_ids if i not in edition_ids]:
        found.append(f"{name} cell {missing}: missing")
    for extra in [i for i in edition_ids if i not in english_ids]:
        found.append(f"{name} cell {extra}: extra (no English cell has this id)")
    if found:
        return found
    if english_ids != edition_ids:
        return [f"{name}: cells in another order than the English notebook"]
    for source, cell in zip(english.cells, edition.cells, strict=True):
        where = f"{name} cell {cell.id}"
        if cell.cell_type != source.cell_type:
            found.append(f"{where}: {cell.cell_type}, the English cell is {source.cell_type}")
        elif cell.cell_type == "code":
            if code_tokens(cell.source) != code_tokens(edition_code(source.source, relative, language)):
                found.append(f"{where}: code differs from the English cell (only comments may be translated)")
            elif cell.get("outputs") != source.get("outputs"):
                found.append(f"{where}: outputs differ from the English cell")
        elif cell.cell_type == "markdown":
            i18n = cell.metadata.get("i18n", {})
            if not i18n.get("source_sha"):
                found.append(f"{where}: not translated")
            elif i18n["source_sha"] != source_sha(source.source):
                found.append(f"{where}: stale (the English text changed since it was translated)")
            elif cell.source == source.source and not i18n.get("same_as_source"):
                found.append(f"{where}: not translated (the English text, without same_as_source)")
    return found


def todo(language: str, relative: Path) -> dict[str, str]:
    """Return ``{cell id: English text}`` for the markdown cells of an edition that need translating."""
    english = {c.id: c for c in nbformat.read(NOTEBOOKS / relative, as_version=4).cells}
    lines = problems(language, relative)
    ids = {line.split(" cell ", 1)[1].split(":", 1)[0] for line in lines if " cell " in line}
    return {i: english[i].source for i in english if i in ids and english[i].cell_type == "markdown"}


def apply(language: str, relative: Path, translations: dict[str, str]) -> int:
    """Put ``translations`` ({cell id: text}) into the edition, each with the current English hash."""
    english = {c.id: c for c in nbformat.read(NOTEBOOKS / relative, as_version=4).cells}
    target = edition_path(language, relative)
    edition = nbformat.read(target, as_version=4)
    unknown = set(translations) - {i for i, c in english.items() if c.cell_type == "markdown"}
    if unknown:
        raise SystemExit(f"{target}: no English markdown cell with id {sorted(unknown)}")
    for cell in edition.cells:
        if cell.id in translations:
            cell.source = translations[cell.id].strip("\n")
            cell.metadata["i18n"] = {"source_sha": source_sha(english[cell.id].source)}
    nbformat.write(edition, target)
    return len(translations)


def _languages(args: list[str]) -> list[str]:
    unknown = [a for a in args if a not in LANGUAGES]
    if unknown:
        raise SystemExit(f"unknown language {unknown}; the editions are {', '.join(LANGUAGES)}")
    return args or list(LANGUAGES)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("sync", "status", "check", "todo", "apply"):
        print(__doc__)
        return 2
    command, args = argv[0], argv[1:]
    if command == "todo":
        print(json.dumps(todo(args[0], Path(args[1])), ensure_ascii=False, indent=1))
        return 0
    if command == "apply":
        count = apply(args[0], Path(args[1]), json.loads(Path(args[2]).read_text(encoding="utf-8")))
        print(f"{count} cells translated in editions/{args[0]}/{args[1]}")
        return 0
    status = 0
    for language in _languages(args):
        if command == "sync":
            for relative in english_notebooks():
                sync(language, relative)
            link_shared(language)
            print(f"editions/{language}: {len(english_notebooks())} notebooks written from notebooks/")
        rows = []
        for relative in english_notebooks():
            lines = problems(language, relative)
            if command == "check":
                for line in lines:
                    print(line)
                status |= bool(lines)
            rows.append((relative.as_posix(), sum("stale" in x for x in lines),
                         sum("not translated" in x for x in lines), len(lines)))
        if command == "status":
            print(f"{LANGUAGES[language]} (editions/{language}): notebook, stale, untranslated, all problems")
            for row in rows:
                print(f"  {row[0]:<42} {row[1]:>5} {row[2]:>5} {row[3]:>5}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

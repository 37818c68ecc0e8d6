"""The course in Vietnamese and Chinese: edition notebooks paired cell by cell with the English ones.

English (``notebooks/``) is the one source of code and outputs. An edition (``editions/vi/``, ``editions/zh-CN/``)
holds the same notebooks under the same names, with the same cells in the same order, matched on cell ids:

- a code cell is the English cell: the same source, outputs and metadata, except that its comments may be
  translated. The code is compared token by token (Python's ``tokenize``) with the comments left out, so a
  translation that changes anything but comments is refused, the notebook and cell named. A cell with translated
  comments records in ``metadata.i18n.source_sha`` the hash of the English code it was made from, as a markdown
  cell does: when the English comments change, the translated ones are stale;
- a markdown cell holds the translation, and records in ``metadata.i18n.source_sha`` the hash of the English
  text it was made from. When the English text changes, the hash no longer matches: the translation is *stale*.
  A cell whose English text is also right in the edition (a formula, a badge) says ``same_as_source: true``.

Commands (``python -m tools.book.editions COMMAND``):

- ``sync [LANG ...]``: write each edition notebook from the English one. Code cells, outputs and notebook metadata
  are copied, except that a code cell keeps its translated comments while the English code is the same but for
  comments (if the English code itself changed, the English cell replaces it, and sync names the cell); a
  markdown cell keeps its translation and hash; a new one gets the English text and no hash (so it is listed as
  untranslated). ``scripts/`` is a link to the English one.
- ``status [LANG ...]``: a table per notebook: stale and untranslated cells, all problems, and the comment lines
  still in English.
- ``todo LANG NOTEBOOK``: the cells that need translating, as JSON ``{cell id: English text}``: the markdown cells
  that are stale or untranslated, and the code cells whose translated comments are stale. The file a translator
  fills in.
- ``apply LANG NOTEBOOK FILE``: put the translations of FILE (JSON ``{cell id: text}``) into the edition and record
  the current English hash of each. A code cell's translation may differ from the English code in comments only.
- ``check [LANG ...]``: exit status 1 and one line per problem (notebook and cell named) if an edition diverges.

Each edition also has its own ``glossary.md``: the English one (``notebooks/glossary.md``) translated, with the same
rows in the same order, the same term columns (English, Tiếng Việt, 中文) and the same section links; its title,
prose, headings and Meaning column are translated. Its first line records the hash of the English glossary it was
made from, so a changed English glossary makes it stale. The notebooks' links ``glossary.md#anchor`` must name a
heading of the edition's glossary (GitHub's and MyST's heading slugs); ``apply`` turns links to the English
glossary's headings into links to the edition's, and so does the book (tools/book/build.py) for text not yet translated.

Why not a library: sphinx-intl's .po catalogs translate a web book, not runnable notebooks, and jupytext pairs
files, not cells; the editions must open in JupyterLab and on Colab, each cell beside its English source.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
import sys
import tokenize
from pathlib import Path

import nbformat

from tools import REPO

NOTEBOOKS = REPO / "notebooks"
EDITIONS = REPO / "editions"
LANGUAGES = {"vi": "Tiếng Việt", "zh-CN": "中文"}
LINKED = ("scripts",)  # shared with the English notebooks, as symbolic links
GLOSSARY = "glossary.md"  # each edition's own translation of notebooks/glossary.md
GLOSSARY_STAMP = re.compile(r"<!-- translated from notebooks/glossary\.md, source_sha: ([0-9a-f]{16}) -->")
SETUP_TAG = "colab-setup"
DIRECTIVE = re.compile(r"#\s*(pyright:|type:|noqa|fmt:|NBVAL_)")  # comments that tools read: never translated


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
    """Return the tokens of a code cell without its comments: Python's token stream less the COMMENT tokens and the
    NL tokens (the line ends that only comment lines, blank lines and lines inside brackets have). Logical line
    ends and indentation are kept, and so are the comments that tools read (``# pyright:``, ``# noqa``, ...).
    IPython's ! and % lines are compared as text, after the Python tokens. A cell that Python cannot tokenize is
    compared whole."""
    marked = _ipython_lines(source)
    lines = [_python_stand_in(kind, line) for kind, line in marked]
    try:
        tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
        kept = [(t.type, t.string) for t in tokens
                if t.type != tokenize.NL and (t.type != tokenize.COMMENT or DIRECTIVE.match(t.string))]
    except (tokenize.TokenError, SyntaxError):
        return [(0, source)]
    magics = [(0, line.strip()) for kind, line in marked if kind != "python"]
    return kept + magics


def _ipython_lines(source: str) -> list[tuple[str, str]]:
    """Return a cell's lines, each marked "python", "escape" (IPython's ! or % line) or "continued" (a line that a
    trailing backslash joins to the escape line above, as IPython joins it)."""
    marked: list[tuple[str, str]] = []
    for line in source.splitlines():
        if marked and marked[-1][0] != "python" and marked[-1][1].rstrip().endswith("\\"):
            marked.append(("continued", line))
        else:
            marked.append(("escape" if line.lstrip().startswith(("!", "%")) else "python", line))
    return marked


def _python_stand_in(kind: str, line: str) -> str:
    """Return what Python's tokenizer reads for a marked line: an escape line becomes ``pass`` at its indent."""
    if kind == "escape":
        stripped = line.lstrip()
        return line[: len(line) - len(stripped)] + "pass  # " + stripped
    return "" if kind == "continued" else line


def comments(source: str) -> list[str]:
    """Return the comments of a code cell (an IPython ! or % line's text is not a comment)."""
    lines = [line if kind == "python" else "" for kind, line in _ipython_lines(source)]
    try:
        tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
        return [t.string for t in tokens if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return []


def english_comment_lines(language: str, relative: Path) -> int:
    """Return how many comments of an edition's code cells are still the English ones."""
    target = edition_path(language, relative)
    if not target.exists():
        return 0
    english = {c.id: c for c in nbformat.read(NOTEBOOKS / relative, as_version=4).cells if c.cell_type == "code"}
    count = 0
    for cell in nbformat.read(target, as_version=4).cells:
        if cell.cell_type == "code" and cell.id in english:
            originals = set(comments(english[cell.id].source))
            count += sum(comment in originals for comment in comments(cell.source))
    return count


def sync(language: str, relative: Path, reset: list[str] | None = None) -> nbformat.NotebookNode:
    """Write the edition of ``relative`` in ``language`` from the English notebook, keeping translations: the
    markdown cells' text, and the code cells' translated comments while the English code is unchanged but for
    comments. The ids of code cells whose translated comments gave way to changed English code go into ``reset``."""
    english = nbformat.read(NOTEBOOKS / relative, as_version=4)
    target = edition_path(language, relative)
    old = {c.id: c for c in nbformat.read(target, as_version=4).cells} if target.exists() else {}
    cells = []
    for cell in english.cells:
        if cell.cell_type != "markdown":
            new = copy.deepcopy(cell)
            new.source = edition_code(cell.source, relative, language)
            previous = old.get(cell.id)
            if previous is not None and previous.cell_type == cell.cell_type and previous.source != new.source:
                translated = cell.cell_type == "code" and "i18n" in previous.metadata  # recorded by apply
                if translated and code_tokens(previous.source) == code_tokens(new.source):
                    new.source = previous.source  # the same code: the translated comments stay
                    new.metadata["i18n"] = previous.metadata["i18n"]
                elif translated and reset is not None:
                    reset.append(cell.id)
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
    """Make ``scripts/`` in the edition a link to the English one."""
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
        return [f"{name}: missing (run: python -m tools.book.editions sync {language})"]
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
    anchors = glossary_anchors(language)
    for source, cell in zip(english.cells, edition.cells, strict=True):
        where = f"{name} cell {cell.id}"
        if cell.cell_type != source.cell_type:
            found.append(f"{where}: {cell.cell_type}, the English cell is {source.cell_type}")
        elif cell.cell_type == "code":
            english_code = edition_code(source.source, relative, language)
            if code_tokens(cell.source) != code_tokens(english_code):
                found.append(f"{where}: code differs from the English cell (only comments may be translated)")
            elif cell.get("outputs") != source.get("outputs"):
                found.append(f"{where}: outputs differ from the English cell")
            elif cell.source != english_code:
                recorded = cell.metadata.get("i18n", {}).get("source_sha")
                if not recorded:
                    found.append(f"{where}: comments or layout differ from the English cell without i18n.source_sha "
                                 "(run sync, or record translated comments with apply)")
                elif recorded != source_sha(english_code):
                    found.append(f"{where}: comments stale (the English code changed since they were translated)")
        elif cell.cell_type == "markdown":
            i18n = cell.metadata.get("i18n", {})
            if not i18n.get("source_sha"):
                found.append(f"{where}: not translated")
            elif i18n["source_sha"] != source_sha(source.source):
                found.append(f"{where}: stale (the English text changed since it was translated)")
            elif cell.source == source.source and not i18n.get("same_as_source"):
                found.append(f"{where}: not translated (the English text, without same_as_source)")
            for anchor in re.findall(r"\]\((?:\.\./)?glossary\.md#([^)\s]+)\)", cell.source):
                if anchors is not None and anchor not in anchors:
                    found.append(f"{where}: links glossary.md#{anchor}, a heading that editions/{language}/{GLOSSARY} "
                                 "does not have")
    return found


def slug(heading: str) -> str:
    """Return a heading's anchor as GitHub and MyST (myst_heading_anchors) make it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace(" ", "-"))


def _headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,3} ", line)]


def glossary_anchors(language: str) -> set[str] | None:
    """Return the anchors a link into an edition's glossary may name (None if the edition has no glossary): its own
    headings' and the English ones, which text copied from the English notebooks still names (``glossary_links``
    turns them into the edition's)."""
    path = EDITIONS / language / GLOSSARY
    if not path.is_file():
        return None
    return set(glossary_anchor_map(language)) | {slug(h) for h in _headings(path.read_text(encoding="utf-8"))}


def glossary_anchor_map(language: str) -> dict[str, str]:
    """Return ``{English heading anchor: the edition's}`` for the glossary's headings, paired in order."""
    path = EDITIONS / language / GLOSSARY
    if not path.is_file() or not (NOTEBOOKS / GLOSSARY).is_file():
        return {}
    english = [slug(h) for h in _headings((NOTEBOOKS / GLOSSARY).read_text(encoding="utf-8"))]
    ours = [slug(h) for h in _headings(path.read_text(encoding="utf-8"))]
    return dict(zip(english, ours, strict=False)) if len(ours) == len(english) else {}


def glossary_links(text: str, language: str) -> str:
    """Return ``text`` with its links to the English glossary's headings pointed at the edition glossary's."""
    anchors = glossary_anchor_map(language)
    return re.sub(r"(\]\((?:\.\./)?glossary\.md#)([^)\s]+)\)",
                  lambda m: f"{m.group(1)}{anchors.get(m.group(2), m.group(2))})", text)


def glossary_rows(text: str) -> list[list[str]]:
    """Return a glossary's table rows below their header rows, as lists of cells."""
    rows, header = [], True
    for line in text.splitlines():
        if not line.startswith("|"):
            header = True
            continue
        if line.startswith("|---"):
            header = False
        elif not header:
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def glossary_problems(language: str) -> list[str]:
    """Return what is wrong with an edition's glossary: missing, stale, or rows that are not the English ones."""
    name = f"editions/{language}/{GLOSSARY}"
    path = EDITIONS / language / GLOSSARY
    if path.is_symlink() or not path.is_file():
        return [f"{name}: missing (a translation of notebooks/{GLOSSARY}, not a link)"]
    english = (NOTEBOOKS / GLOSSARY).read_text(encoding="utf-8")
    text = path.read_text(encoding="utf-8")
    found = []
    stamp = GLOSSARY_STAMP.search(text.split("\n", 1)[0])
    if not stamp:
        found.append(f"{name}: its first line does not record the English glossary's hash ({GLOSSARY_STAMP.pattern})")
    elif stamp.group(1) != source_sha(english):
        found.append(f"{name}: stale (notebooks/{GLOSSARY} changed since it was translated)")
    ours, theirs = glossary_rows(text), glossary_rows(english)
    if len(ours) != len(theirs):
        found.append(f"{name}: {len(ours)} table rows, the English glossary has {len(theirs)}")
    for row, source in zip(ours, theirs, strict=False):
        links = [re.findall(r"\[[^]]*\]\([^)]*\)", cells[4]) if len(cells) == 5 else cells for cells in (row, source)]
        if len(row) != len(source) or row[:3] != source[:3] or links[0] != links[1]:
            found.append(f"{name} row {source[0]}: its terms or sections differ from the English row")
        elif row[3] == source[3]:
            found.append(f"{name} row {source[0]}: the meaning is not translated")
    if len(_headings(text)) != len(_headings(english)):
        found.append(f"{name}: {len(_headings(text))} headings, the English glossary has {len(_headings(english))}")
    return found


def todo(language: str, relative: Path) -> dict[str, str]:
    """Return ``{cell id: English text}`` for the cells of an edition that need translating: markdown cells that
    are stale or untranslated, and code cells whose translated comments are stale."""
    english = {c.id: c for c in nbformat.read(NOTEBOOKS / relative, as_version=4).cells}
    lines = [line for line in problems(language, relative) if "stale" in line or "not translated" in line
             or "without i18n.source_sha" in line]
    ids = {line.split(" cell ", 1)[1].split(":", 1)[0] for line in lines if " cell " in line}
    return {i: edition_code(english[i].source, relative, language) if english[i].cell_type == "code"
            else english[i].source for i in english if i in ids and english[i].cell_type in ("markdown", "code")}


def apply(language: str, relative: Path, translations: dict[str, str]) -> int:
    """Put ``translations`` ({cell id: text}) into the edition, each with the current English hash."""
    english = {c.id: c for c in nbformat.read(NOTEBOOKS / relative, as_version=4).cells}
    target = edition_path(language, relative)
    edition = nbformat.read(target, as_version=4)
    unknown = set(translations) - {i for i, c in english.items() if c.cell_type in ("markdown", "code")}
    if unknown:
        raise SystemExit(f"{target}: no English markdown or code cell with id {sorted(unknown)}")
    for cell in edition.cells:
        if cell.id in translations and cell.cell_type == "code":
            code = edition_code(english[cell.id].source, relative, language)
            text = translations[cell.id].strip("\n")
            if code_tokens(text) != code_tokens(code):
                raise SystemExit(f"{target} cell {cell.id}: the translation changes the code, not only comments")
            cell.source = text
            cell.metadata.pop("i18n", None)
            if text != code:
                cell.metadata["i18n"] = {"source_sha": source_sha(code)}
        elif cell.id in translations:
            cell.source = glossary_links(translations[cell.id].strip("\n"), language)
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
    if command in ("todo", "apply"):
        if len(args) != (2 if command == "todo" else 3):
            print(__doc__)
            return 2
        _languages(args[:1])
        if not (NOTEBOOKS / args[1]).is_file():
            raise SystemExit(f"no notebook notebooks/{args[1]}: name it as it lies under notebooks/, e.g. "
                             "11_survive.ipynb or solutions/11_survive.ipynb")
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
                reset: list[str] = []
                sync(language, relative, reset)
                for cell in reset:
                    print(f"editions/{language}/{relative.as_posix()} cell {cell}: the English code changed; its "
                          "translated comments were replaced by the English ones")
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
                         sum("not translated" in x for x in lines), len(lines),
                         english_comment_lines(language, relative)))
        lines = glossary_problems(language)
        rows.append((GLOSSARY, sum("stale" in x for x in lines), sum("not translated" in x for x in lines),
                     len(lines), 0))
        if command == "check":
            for line in lines:
                print(line)
            status |= bool(lines)
        if command == "status":
            print(f"{LANGUAGES[language]} (editions/{language}): notebook, stale, untranslated, all problems, "
                  "comments in English")
            for row in rows:
                print(f"  {row[0]:<42} {row[1]:>5} {row[2]:>5} {row[3]:>5} {row[4]:>5}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

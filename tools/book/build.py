"""Build the course as a static web book from the stored outputs: `make book`.

Sphinx with MyST-NB and sphinx-book-theme renders each notebook with the outputs it stores: no notebook runs and
nothing is downloaded (`nb_execution_mode = "off"`). One site per edition, English first, then Vietnamese and
Chinese (from ``editions/``, tools/book/editions.py), under ``build/book/html/{en,vi,zh-CN}/`` with a language switch on
every page, and ``build/book/html/index.html`` leading to them. Each edition gets:

- a front page: the README's chapter table, with its links pointing at the pages; in the Vietnamese and Chinese
  editions, its translation (``tools/book/front/{edition}.md``, whose first line records the hash of the English
  table it was made from, so that a changed README makes it stale: ``table_problems``);
- the chapters in order, then the solutions and the glossary (the edition's own translation), every label of the
  sidebar in the edition's language;
- Sphinx's search (a JavaScript index shipped with the pages: it works offline);
- the notebooks' math (``$2048 \\times 2048$``: MyST's ``dollarmath``), typeset by a copy of MathJax shipped with
  the pages, so that it too works offline;
- on every page, Colab and Binder buttons and "download notebook" (the theme's launch and download buttons);
- the Colab badge and setup cells left out (the buttons replace them).

A warning fails the build (``-W -n``). Usage: python -m tools.book.build [--out build/book] [--editions en vi zh-CN]
(run with the book's environment, .venv-book, which `make book` creates from requirements-book.txt).

Why this module: Sphinx and MyST-NB render the pages; what is ours is the three editions' configuration, the front
page from the README's chapter table and the language switch. (jupyter-book 2 needs Node and the network.)
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from tools import REPO as ROOT
from tools.book.editions import glossary_links, source_sha
from tools.outputs.colab_cells import BADGE_ID, BRANCH, REPOSITORY, SETUP_ID

MINIMUM_PYTHON = (3, 11)  # Sphinx 9, myst-parser 5.2, sphinx-book-theme 1.4 and pydata-sphinx-theme 0.20 need it
EDITIONS = {  # edition: (its name, its source folder, Sphinx's language code)
    "en": ("English", "notebooks", "en"),
    "vi": ("Tiếng Việt", "editions/vi", "vi"),
    "zh-CN": ("中文", "editions/zh-CN", "zh_CN"),
}
TITLES = {"en": "Using GPUs in PyTorch", "vi": "Dùng GPU trong PyTorch", "zh-CN": "在PyTorch中使用GPU"}
FRONT = {
    "en": "A hands-on course: every notebook runs on a laptop's CPU, on Colab's T4 and on bigger GPUs. These pages "
          "show what each notebook printed when it last ran, on a CPU: a GPU cell there says why it skipped.",
    "vi": "Một khóa học thực hành: mỗi notebook chạy trên CPU của máy tính xách tay, trên GPU T4 của Colab và trên "
          "các GPU lớn hơn. Các trang này cho thấy kết quả mà mỗi notebook in ra ở lần chạy gần nhất, trên CPU: "
          "một ô cần GPU sẽ nói vì sao nó được bỏ qua.",
    "zh-CN": "一门动手实践的课程：每个Jupyter笔记本都能在笔记本电脑的CPU、Colab的T4以及更大的GPU上运行。"
             "这些页面展示每个笔记本上次在CPU上运行时的输出：需要GPU的单元格会说明它为何被跳过。",
}
CHAPTERS_HEADING = {"en": "Chapters", "vi": "Các chương", "zh-CN": "章节"}
MORE_HEADING = {"en": "Solutions and glossary", "vi": "Lời giải và bảng thuật ngữ", "zh-CN": "参考答案与术语表"}
LANGUAGES_LABEL = {"en": "Languages", "vi": "Ngôn ngữ", "zh-CN": "语言"}
SEARCH_TEXT = {"en": "Search...", "vi": "Tìm kiếm...", "zh-CN": "搜索……"}  # the theme translates its other labels
TABLES = Path(__file__).resolve().parent / "front"  # the editions' translations of the README's chapter table
TABLE_STAMP = re.compile(r"<!-- translated from README\.md's chapter table, source_sha: ([0-9a-f]{16}) -->")


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:2])) -> None:
    """Stop with one clear line when this Python is too old for the book's tools."""
    if version < MINIMUM_PYTHON:
        raise SystemExit(f"make book needs Python {MINIMUM_PYTHON[0]}.{MINIMUM_PYTHON[1]} or newer (this is "
                         f"{version[0]}.{version[1]}): run  make book BOOK_PYTHON=python3.11")


def readme_table(readme: str) -> str:
    """Return the README's chapter table as it is written there."""
    if "## Chapters" not in readme:
        raise ValueError("the README has no '## Chapters' section")
    rows: list[str] = []
    for line in readme.split("## Chapters", 1)[1].splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    if not rows:
        raise ValueError("the README has no chapter table under '## Chapters'")
    return "\n".join(rows)


def translated_table(edition: str) -> str:
    """Return an edition's translation of the README's chapter table (its stamp line left out)."""
    path = TABLES / f"{edition}.md"
    if not path.is_file():
        raise SystemExit(f"{path.relative_to(ROOT)} is missing: the {EDITIONS[edition][0]} front page's chapter table")
    return "\n".join(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("|"))


def chapter_table(readme: str, edition: str = "en") -> str:
    """Return the chapter table of an edition's front page (the README's, or its translation), with its links
    made relative to the book's pages."""
    table = readme_table(readme) if edition == "en" else translated_table(edition)
    return re.sub(r"\]\(notebooks/([^)]+)\.ipynb\)", r"](\1.ipynb)", table)


def _cells(table: str) -> list[list[str]]:
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in table.splitlines()
            if not row.startswith("|---")]


def table_problems(edition: str, readme: str) -> list[str]:
    """Return what is wrong with an edition's translated chapter table: stale, or not the README's rows (the same
    notebooks, in order), or text left in English."""
    name = f"tools/book/front/{edition}.md"
    path = TABLES / f"{edition}.md"
    if not path.is_file():
        return [f"{name}: missing (a translation of the README's chapter table)"]
    english = readme_table(readme)
    stamp = TABLE_STAMP.search(path.read_text(encoding="utf-8").split("\n", 1)[0])
    found = []
    if not stamp:
        found.append(f"{name}: its first line does not record the English table's hash ({TABLE_STAMP.pattern})")
    elif stamp.group(1) != source_sha(english):
        found.append(f"{name}: stale (the README's chapter table changed since it was translated)")
    ours, theirs = _cells(translated_table(edition)), _cells(english)
    if len(ours) != len(theirs):
        found.append(f"{name}: {len(ours)} rows, the README's table has {len(theirs)}")
    for row, source in zip(ours, theirs, strict=False):
        if len(row) != len(source) or row[0] != source[0] and source[0].startswith("["):
            found.append(f"{name} row {source[0]}: not the README's row (its notebook or columns differ)")
        elif any(cell == english_cell for cell, english_cell in zip(row[1:], source[1:], strict=True)):
            found.append(f"{name} row {source[0]}: in English (a cell is the README's text)")
    return found


def pages(source: Path) -> tuple[list[str], list[str]]:
    """Return the chapter and solution pages of an edition folder, in order (without .ipynb)."""
    chapters = sorted(p.stem for p in source.glob("[0-9][0-9]*.ipynb"))
    solutions = sorted(f"solutions/{p.stem}" for p in (source / "solutions").glob("[0-9][0-9]*.ipynb"))
    return chapters, solutions


def front_page(edition: str, chapters: list[str], solutions: list[str], readme: str) -> str:
    toctree = "\n".join(["```{toctree}", ":maxdepth: 1", f":caption: {CHAPTERS_HEADING[edition]}", "", *chapters,
                         "```", "", "```{toctree}", ":maxdepth: 1", f":caption: {MORE_HEADING[edition]}", "",
                         *solutions, "glossary", "```"])
    return f"# {TITLES[edition]}\n\n{FRONT[edition]}\n\n{chapter_table(readme, edition)}\n\n{toctree}\n"


def conf_py(edition: str) -> str:
    name, folder, language = EDITIONS[edition]
    options = {
        "repository_url": f"https://github.com/{REPOSITORY}",
        "repository_branch": BRANCH,
        "path_to_docs": folder,
        "use_repository_button": True,
        "use_download_button": True,
        "search_bar_text": SEARCH_TEXT[edition],
        "launch_buttons": {"colab_url": "https://colab.research.google.com", "binderhub_url": "https://mybinder.org",
                           "notebook_interface": "jupyterlab"},
    }
    return "\n".join([
        "# written by tools/book/build.py",
        f"project = {TITLES[edition]!r}",
        f"language = {language!r}",
        'extensions = ["myst_nb"]',
        'nb_execution_mode = "off"  # render the stored outputs; never start a kernel',
        'html_theme = "sphinx_book_theme"',
        f"html_title = {TITLES[edition]!r}",
        f"html_theme_options = {options!r}",
        'templates_path = ["_templates"]',
        'html_sidebars = {"**": ["navbar-logo.html", "search-button-field.html", "sbt-sidebar-nav.html", '
        '"languages.html"]}',
        'exclude_patterns = ["_build", "**/.ipynb_checkpoints", "scripts"]',
        "myst_heading_anchors = 3",
        'myst_enable_extensions = ["dollarmath"]  # $...$ and $$...$$ are math, as in Jupyter',
        'html_static_path = ["_static"]',
        'mathjax_path = "mathjax/tex-chtml.js"  # the copy in _static: no network needed',
        # ipywidgets' sliders need a kernel: the page shows their plain-text line instead
        'suppress_warnings = ["mystnb.unknown_mime_type"]',
        "",
    ])


def languages_template(edition: str) -> str:
    """Return the sidebar block that links the same page in every edition."""
    links = []
    for other, (name, _, _) in EDITIONS.items():
        if other == edition:
            links.append(f"<strong>{name}</strong>")
        else:
            links.append(f'<a href="{{{{ root }}}}/../{other}/{{{{ pagename }}}}.html">{name}</a>')
    return ("{% set index = pathto(root_doc) %}"
            "{% set root = index.rsplit('/', 1)[0] if '/' in index else '.' %}\n"
            f'<nav class="course-languages" aria-label="{LANGUAGES_LABEL[edition]}"><p>' + " · ".join(links)
            + "</p></nav>\n")


def prepare(edition: str, src: Path) -> None:
    """Write the Sphinx source folder of ``edition``: its notebooks (Colab cells removed), glossary, scripts,
    front page, conf.py and the language switch."""
    source = ROOT / EDITIONS[edition][1]
    if not (source / "01_devices.ipynb").exists():
        raise SystemExit(f"{source.relative_to(ROOT)} has no notebooks: run  python -m tools.book.editions sync")
    if src.exists():
        shutil.rmtree(src)
    (src / "solutions").mkdir(parents=True)
    chapters, solutions = pages(source)
    # every notebook goes in, also one the table of contents lacks: Sphinx then stops (-W) naming it
    every = sorted(str(p.relative_to(source).with_suffix("")) for p in source.rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)
    for page in every:
        notebook = nbformat.read(source / f"{page}.ipynb", as_version=4)
        for cell in notebook.cells:
            if cell.get("id") in (BADGE_ID, SETUP_ID):
                cell.metadata.setdefault("tags", []).append("remove-cell")
            elif edition != "en" and cell.cell_type == "markdown":  # text not yet translated links English anchors
                cell.source = glossary_links(cell.source, edition)
        nbformat.write(notebook, src / f"{page}.ipynb")
    shutil.copyfile(source / "glossary.md", src / "glossary.md")  # each edition's own, in its language
    shutil.copytree(ROOT / "notebooks" / "scripts", src / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "index.md").write_text(front_page(edition, chapters, solutions, (ROOT / "README.md").read_text()))
    (src / "conf.py").write_text(conf_py(edition))
    (src / "_templates").mkdir()
    (src / "_static").mkdir()  # MathJax goes here (copy_mathjax)
    (src / "_templates" / "languages.html").write_text(languages_template(edition))


# MathJax 3 for the pages' math, from the package sphinx-mathjax-offline (requirements-book.txt), which holds
# MathJax 3.2.2's whole distribution (24 MB): each edition takes what TeX input and HTML output need (about 2 MB).
MATHJAX_PACKAGE = "sphinx-mathjax-offline"
MATHJAX_FILES = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2")


def copy_mathjax(folder: Path) -> None:
    """Copy the parts of MathJax that the pages load into ``folder`` (an edition's _static/mathjax)."""
    spec = importlib.util.find_spec(MATHJAX_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"MathJax is missing ({MATHJAX_PACKAGE}): run  make book, which installs "
                         "requirements-book.txt")
    source = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax"
    for name in MATHJAX_FILES:
        if (source / name).is_dir():
            shutil.copytree(source / name, folder / name)
        else:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, folder / name)


def root_page() -> str:
    links = "\n".join(f'<li><a href="{e}/index.html">{name}</a></li>' for e, (name, _, _) in EDITIONS.items())
    return ('<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Using GPUs in PyTorch</title>\n'
            '<meta http-equiv="refresh" content="0; url=en/index.html"></head>\n'
            f"<body><h1>Using GPUs in PyTorch</h1><ul>\n{links}\n</ul></body></html>\n")


def build(out: Path, editions: list[str]) -> None:
    check_python()
    html = out / "html"
    for edition in editions:
        src = out / "src" / edition
        prepare(edition, src)
        copy_mathjax(src / "_static" / "mathjax")
        command = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "-n", "--keep-going", "-q",
                   str(src), str(html / edition)]
        print(f"building {EDITIONS[edition][0]} -> {html / edition}", flush=True)
        subprocess.run(command, check=True)
    (html / "index.html").write_text(root_page())
    print(f"the book: {html / 'index.html'}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book")
    parser.add_argument("--editions", nargs="+", default=list(EDITIONS), choices=list(EDITIONS))
    args = parser.parse_args(argv)
    try:
        build(args.out, args.editions)
    except subprocess.CalledProcessError as err:
        print(f"the book did not build (sphinx exit status {err.returncode}): see the warnings above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

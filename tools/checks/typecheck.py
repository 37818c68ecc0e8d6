"""Type-check the course's code against torch's own type hints, notebooks included: part of `make lint`.

CI has no GPU, so it never executes the cells behind ``needs_gpus`` nor the CUDA branches of d2l_ext and
scripts; a misspelt ``torch.cuda.*`` name or keyword there would first fail on a learner's GPU. A static
check reads that code anyway. Each notebook becomes one Python file under build/typecheck/ (its code cells in
order, IPython syntax such as ``!cmd`` and ``%magic`` turned into the calls IPython makes), basedpyright
checks those files and the packages with the settings in pyproject.toml's [tool.basedpyright], and each
finding is printed where it is in the notebook: ``notebooks/04_async_and_gil.ipynb cell 13 line 4: error: ...``
(cell: 0-based position in the notebook, markdown cells included; line: 1-based within the cell).

nbqa 1.9.1 was tried in its place (2026-11-27) and not adopted: it replaces the Colab setup cell of every
notebook by a placeholder, since its ``!git clone`` line ends with a backslash, so a mistake there went unreported;
its findings count code cells only and need a wrapper to be mapped at all; and the course's other code needs a
second basedpyright run. The wrappers cost about the ~100 lines it would save.

Usage: python -m tools.checks.typecheck [PATH ...]   (notebooks, .py files or folders; default: the whole course)
Exit status: 0 without errors, 1 with errors (warnings are printed and do not fail), 2 if the check broke.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tools import REPO

DEFAULT_PATHS = ["notebooks", "d2l_ext", "tools", "tests"]

# Rules off in the files made from notebooks only, each for a reason that holds for notebooks and not for
# modules: a cell's last expression is its displayed output (reportUnusedExpression); cells glued into one
# file make names defined in a guarded cell or a loop "possibly unbound" in later cells, and a notebook may
# define a name again in a later cell, e.g. a better version of a function (reportPossiblyUnboundVariable,
# reportRedeclaration).
NOTEBOOK_HEADER = (
    "# pyright: reportUnusedExpression=false, reportPossiblyUnboundVariable=false, reportRedeclaration=false\n"
    "from IPython.core.interactiveshell import InteractiveShell as _InteractiveShell\n"
    "def get_ipython() -> _InteractiveShell: ...  # in a notebook, IPython's shell is always there\n"
)
# line magics written as assignments: `files = !ls`, `t = %timeit -o f()`
ASSIGNED_ESCAPE = re.compile(r"^(?P<target>[\w.\[\], ]+?)\s*=\s*(?P<escape>[!%].*)$")
# cell magics whose body is Python: the body is checked, the magic line is commented out
PYTHON_CELL_MAGICS = {"time", "timeit", "prun", "capture", "debug"}


@dataclass
class Converted:
    """A notebook as one Python file, with where each of its lines comes from."""

    notebook: Path
    text: str = ""
    # 0-based line of the Python file -> (cell index, 1-based line in the cell); header and separators absent
    lines: dict[int, tuple[int, int]] = field(default_factory=dict)


def escape_to_python(escape: str) -> str:
    """Return the call IPython makes for the line ``escape`` (``!cmd`` or ``%magic args``), as Python."""
    if escape.startswith("!"):
        command = escape[2:] if escape.startswith("!!") else escape[1:]
        return f"get_ipython().getoutput({command.strip()!r})" if escape.startswith("!!") else \
            f"get_ipython().system({command.strip()!r})"
    name, _, rest = escape[1:].partition(" ")
    return f"get_ipython().run_line_magic({name!r}, {rest.strip()!r})"


def cell_to_python(source: str) -> list[str]:
    """Return a code cell's lines as valid Python, one line for each line of the cell."""
    lines = source.splitlines() or [""]
    first = lines[0].strip()
    if first.startswith("%%"):
        name, _, rest = first[2:].partition(" ")
        if name in PYTHON_CELL_MAGICS:
            return [f"pass  # %%{name} {rest}".rstrip(), *lines[1:]]
        body = "\n".join(lines[1:]) + "\n"
        call = f"get_ipython().run_cell_magic({name!r}, {rest.strip()!r}, {body!r})"
        return [call] + ["# " + line for line in lines[1:]]  # not Python: kept as comments, lines stay put
    try:
        ast.parse(source)
        return lines  # plain Python (the usual case)
    except SyntaxError:
        pass
    converted = []
    continued = 0  # lines already joined to an escape line ending in a backslash, as IPython joins them
    for number, line in enumerate(lines):
        if continued:
            continued -= 1
            converted.append("")  # kept, so that line numbers still match the cell's
            continue
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        assigned = ASSIGNED_ESCAPE.match(stripped)
        if stripped.startswith(("!", "%")):
            while stripped.endswith("\\") and number + continued + 1 < len(lines):
                continued += 1
                stripped = stripped[:-1] + " " + lines[number + continued].strip()
            line = indent + escape_to_python(stripped)
        elif assigned and not stripped.startswith(("#", "'", '"')):
            escape = assigned["escape"]
            call = escape_to_python(escape)
            if escape.startswith("!") and not escape.startswith("!!"):
                call = call.replace(".system(", ".getoutput(", 1)  # `x = !cmd` keeps the output
            line = f"{indent}{assigned['target']} = {call}"
        converted.append(line)
    return converted


def convert(notebook: Path) -> Converted:
    """Return ``notebook``'s code cells as one Python file, with its line map."""
    result = Converted(notebook)
    out: list[str] = list(NOTEBOOK_HEADER.splitlines())
    for index, cell in enumerate(nbformat.read(notebook, as_version=4).cells):
        if cell.cell_type != "code":
            continue
        out.append(f"# %% cell {index}")
        for number, line in enumerate(cell_to_python(cell.source), start=1):
            result.lines[len(out)] = (index, number)
            out.append(line)
        out.append("")
    result.text = "\n".join(out) + "\n"
    return result


def collect(paths: list[str]) -> tuple[list[Path], list[Path]]:
    """Return the notebooks and the Python files or folders named by ``paths`` (folders: both, recursively)."""
    notebooks: list[Path] = []
    python: list[Path] = []
    for arg in paths:
        path = Path(arg).resolve()
        if path.is_dir():
            notebooks += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
            # the .py files, not the folder: basedpyright would read the notebooks in it too, without this map
            python += sorted(p for p in path.rglob("*.py") if not {".ipynb_checkpoints", "__pycache__"} & set(p.parts))
        elif path.suffix == ".ipynb":
            notebooks.append(path)
        elif path.suffix == ".py":
            python.append(path)
        else:
            raise SystemExit(f"typecheck: {arg}: not a notebook, a .py file or a folder")
    return notebooks, python


def shown(path: Path) -> str:
    """Return ``path`` relative to the repository where it is inside it."""
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def run_basedpyright(files: list[Path]) -> dict:
    """Run basedpyright on ``files`` with the repository's settings; return its JSON report."""
    executable = Path(sys.executable).with_name("basedpyright")
    command = [str(executable) if executable.exists() else "basedpyright", "--outputjson",
               "--project", str(REPO / "pyproject.toml"), "--pythonpath", sys.executable, *map(str, files)]
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    try:
        return json.loads(process.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"typecheck: basedpyright failed (exit {process.returncode}):\n"
                         f"{process.stdout[-2000:]}{process.stderr[-2000:]}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("paths", nargs="*", help="notebooks, .py files or folders (default: the whole course)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "typecheck",
                        help="where the notebooks' Python files go (default: build/typecheck)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="a file recording the inputs of the last clean check of the whole course: when they are "
                             "the same (every file git lists, the packages, the Python), say so and check nothing")
    args = parser.parse_args(argv)
    started = time.monotonic()
    key = None
    if args.cache and not args.paths:
        from tools.result_cache import environment_key, repository_files

        files = repository_files(REPO)
        if files is not None:
            key = environment_key([]) + "".join(f"{n}:{h}\n" for n, h in files.items())
            key = hashlib.sha256(key.encode()).hexdigest()
            if args.cache.is_file() and args.cache.read_text() == key:
                print("typecheck: no file, package or setting changed since its last clean run (FRESH=1 runs it)")
                return 0
            args.cache.unlink(missing_ok=True)
    paths = args.paths or [str(REPO / p) for p in DEFAULT_PATHS]
    notebooks, python = collect(paths)
    out: Path = args.out.resolve()
    converted: dict[Path, Converted] = {}
    for notebook in notebooks:
        # the notebook's own path under out/, so that two notebooks of the same name stay apart
        relative = Path(shown(notebook).lstrip("/"))
        target = (out / relative).with_suffix(".py")  # overwritten; basedpyright reads only the files named
        target.parent.mkdir(parents=True, exist_ok=True)
        converted[target] = convert(notebook)
        target.write_text(converted[target].text, encoding="utf-8")
    report = run_basedpyright([*converted, *python])
    counts = {"error": 0, "warning": 0}
    for finding in report.get("generalDiagnostics", []):
        severity = finding["severity"]
        if severity not in counts:
            continue  # "information": hints, never failures
        counts[severity] += 1
        file = Path(finding["file"]).resolve()
        line = finding["range"]["start"]["line"]
        message = "; ".join(part.strip() for part in finding["message"].replace("\u00a0", " ").splitlines())
        rule = f" [{finding['rule']}]" if finding.get("rule") else ""
        if file in converted and line in converted[file].lines:
            cell, cell_line = converted[file].lines[line]
            where = f"{shown(converted[file].notebook)} cell {cell} line {cell_line}"
        elif file in converted:  # in the lines this tool adds: a bug of the tool, shown where it is
            where = f"{shown(converted[file].notebook)} (converted: {shown(file)}:{line + 1})"
        else:
            where = f"{shown(file)}:{line + 1}"
        print(f"{where}: {severity}: {message}{rule}")
    print(f"typecheck: {len(notebooks)} notebooks and {len(python)} Python files, {counts['error']} errors, "
          f"{counts['warning']} warnings, in {time.monotonic() - started:.1f} s (basedpyright "
          f"{report.get('version', '?')})")
    if key is not None and not counts["error"]:
        args.cache.write_text(key)
    return 1 if counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())

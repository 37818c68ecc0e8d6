"""tools/: the rules of tools/README.md hold (no circle, no import of the tests, no sys.path hack, every make target
mapped), and make test's settings come from the one file that the tools read too."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from tools.outputs import run

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"


def modules() -> dict[str, Path]:
    """Return every module of tools/ by its dotted name (tools.checks.tags), packages included."""
    found = {}
    for path in sorted(TOOLS.rglob("*.py")):
        if "pretend" in path.parts:  # loaded through PYTHONPATH as sitecustomize, never imported by name
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path) -> set[str]:
    """Return the modules ``path`` imports, at the top or inside a function (a lazy import is an import too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def graph() -> dict[str, set[str]]:
    names = modules()
    return {name: {m for m in imports(path) if m in names and m != name} for name, path in names.items()}


def test_no_tool_imports_the_tests_or_edits_sys_path():
    for name, path in modules().items():
        assert not {m for m in imports(path) if m == "tests" or m.startswith("tests.")}, f"{name} imports tests/"
        assert "sys.path" not in path.read_text(encoding="utf-8"), f"{name} edits sys.path: run it with python -m"


def test_no_two_tool_modules_import_each_other_directly_or_in_a_loop():
    edges = graph()
    assert edges["tools.envs.matrix"] >= {"tools.envs.colab", "tools.envs.venvs"}  # the graph is read at all
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        assert name not in path, "import circle: " + " -> ".join([*path[path.index(name):], name])
        if name in done:
            return
        for other in sorted(edges[name]):
            if other != name.rsplit(".", 1)[0]:  # a module importing its own package's __init__ is no circle
                visit(other, [*path, name])
        done.add(name)

    for name in sorted(edges):
        visit(name, [])


def test_the_leaves_and_outputs_import_only_what_the_rules_allow():
    edges = graph()
    for leaf in ("tools.envs.venvs", "tools.result_cache"):
        assert edges[leaf] <= {"tools"}, f"{leaf} must stay a leaf: it imports {edges[leaf]}"
    for name, imported in edges.items():
        if name.startswith("tools.outputs"):
            outside = {m for m in imported if m != "tools" and not m.startswith("tools.outputs")}
            assert not outside, f"{name} imports {outside}: outputs/ imports nothing else from tools/"


def test_every_group_says_what_it_is_for_and_every_make_target_is_mapped():
    for folder in sorted(p for p in TOOLS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
        assert docstring, f"tools/{folder.name}/__init__.py has no docstring saying what the folder is for"
    # the targets as make reads them (its database), and what `make help` prints: not the Makefile's text
    database = subprocess.run(["make", "-pRrq", "-C", str(REPO), ":"], capture_output=True, text=True).stdout
    phony = next(row for row in database.splitlines() if row.startswith(".PHONY:")).split(":", 1)[1].split()
    rules = dict(re.findall(r"^([a-z][a-z-]*): ?(.*)$", database, flags=re.M))
    aliases = {name for name in phony  # the old names: gpu-check is check-gpu
               if re.fullmatch(r"[a-z]+-check", name) and rules.get(name, "").startswith("check-")}
    targets = set(phony) - {"help", "clean"} - aliases
    readme = (TOOLS / "README.md").read_text(encoding="utf-8")
    missing = sorted(t for t in targets if f"`make {t}`" not in readme)
    assert not missing, f"tools/README.md does not map these make targets: {missing}"
    help_text = subprocess.run(["make", "-s", "-C", str(REPO), "help"], capture_output=True, text=True).stdout
    assert not sorted(t for t in targets if f"make {t} " not in help_text), "make help leaves out a target"
    for module in re.findall(r"`((?:outputs|checks|envs|book|browser)/[a-z_]+\.py)`", readme):
        assert (TOOLS / module).exists(), f"tools/README.md names {module}, which is not there"


def test_make_and_the_tools_run_the_notebooks_with_the_same_settings():
    """settings.mk is the one source: what make test runs the notebooks with is what the tools read from it."""
    assert run.TEST_ENVIRONMENT["MKL_CBWR"] and run.TEST_ENVIRONMENT["OMP_NUM_THREADS"] == "1"
    assert run.NBVAL_OPTIONS[0] == "--nbval" and "--nbval-current-env" in run.NBVAL_OPTIONS
    done = subprocess.run(["make", "-n", "--no-print-directory", "notebooks", "VENV=/nonexistent-venv",
                           "PYTHON=true"], cwd=REPO, capture_output=True, text=True, timeout=60)
    command = next(line for line in done.stdout.splitlines() if " -m pytest " in line)
    pins = " ".join(f"{key}={value}" for key, value in run.TEST_ENVIRONMENT.items())
    assert command.startswith(f"env {pins} "), command
    assert " ".join(run.NBVAL_OPTIONS) in command, command
    for text in (makefile := (REPO / "Makefile").read_text(encoding="utf-8"), (REPO / ".ci" / "run").read_text()):
        assert "MKL_CBWR=AVX2" not in text and "--nbval-cell-timeout" not in text  # written once, in settings.mk
    assert "include tools/outputs/settings.mk" in makefile


def test_no_module_of_d2l_ext_or_tools_passes_500_lines():
    """Issue 45: a module past 500 lines mixes concerns (launch.py held four, memory.py three): split it by concern."""
    long = {str(path.relative_to(REPO)): count for path in sorted([*REPO.glob("d2l_ext/**/*.py"), *TOOLS.rglob("*.py")])
            if (count := len(path.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, f"modules over 500 lines: {long}"

"""Is this torch new enough for the course? The oldest torch it is tested with, and the APIs each chapter uses.

The oldest torch the course supports is Colab's (``make test-colab`` runs every notebook on it). An older one
may still run most chapters; what it certainly cannot run is a chapter that calls an API it lacks. The chapters
say which APIs they call, in their code: ``chapter_apis`` reads every ``torch.…`` name from the notebooks'
code cells (imports and aliases such as ``from torch import nn`` followed), so the check cannot drift from them.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import torch

OLDEST_TORCH = (2, 11)  # Colab's torch on 2026-08-19 (tests/envs/colab.txt); make test-colab runs it
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def version_tuple(version: str) -> tuple[int, int]:
    """Return (major, minor) of a version such as ``2.11.0+cu128`` or ``2.6.0a0``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return int(match[1]), int(match[2])


def _code(source: str) -> str:
    """Return a cell's Python without IPython's ``!shell`` and ``%magic`` lines."""
    return "\n".join("pass" if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines())


def used_names(sources: list[str]) -> set[str]:
    """Return the dotted ``torch…`` names that the cells ``sources`` of one notebook import or read, with the
    aliases their imports make (``from torch import nn`` then ``nn.Linear`` -> ``torch.nn.Linear``)."""
    trees = []
    for source in sources:
        try:
            trees.append(ast.parse(_code(source)))
        except SyntaxError:
            continue
    aliases: dict[str, str] = {}
    found: set[str] = set()
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                found.add(f"{node.module}.{alias.name}")
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Attribute):
            parts = []
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases:
                found.add(".".join([aliases[inner.id], *reversed(parts)]))
    return found


def resolves(name: str) -> bool:
    """Return whether the dotted name exists in the installed torch (importing submodules on the way)."""
    parts = name.split(".")
    target: object = importlib.import_module(parts[0])
    for index, part in enumerate(parts[1:], start=1):
        if hasattr(target, part):
            target = getattr(target, part)
            continue
        try:
            target = importlib.import_module(".".join(parts[: index + 1]))
        except Exception:  # missing, or failing to import in this build: either way a chapter cannot use it
            return False
    return True


def chapter_apis(notebooks: Path = NOTEBOOKS) -> dict[str, set[str]]:
    """Return, for each notebook (stem, solutions as ``solutions/NAME``) and each script that chapter 6 launches
    (``scripts/NAME.py``), the torch names its code uses."""
    found = {}
    for path in sorted(notebooks.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        cells = json.loads(path.read_text())["cells"]
        sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        found[path.relative_to(notebooks).with_suffix("").as_posix()] = used_names(sources)
    for path in sorted(notebooks.glob("scripts/*.py")):  # what chapter 6 launches
        found[path.relative_to(notebooks).as_posix()] = used_names([path.read_text()])
    return found


def missing_apis(notebooks: Path = NOTEBOOKS) -> dict[str, list[str]]:
    """Return {torch name: notebooks that use it} for the names this torch lacks (attributes of tensors and
    modules that only exist at run time are not read, so a name counted here is a real gap)."""
    missing: dict[str, list[str]] = {}
    for notebook, names in chapter_apis(notebooks).items():
        for name in sorted(names):
            if not resolves(name):
                missing.setdefault(name, []).append(notebook)
    return missing


def torch_check(version: str | None = None, notebooks: Path = NOTEBOOKS) -> str | None:
    """Return one line if this torch is older than the course's oldest or lacks an API a chapter uses, else None."""
    version = version or torch.__version__
    oldest = ".".join(map(str, OLDEST_TORCH))
    gaps = missing_apis(notebooks) if notebooks.is_dir() else {}
    if version_tuple(version) >= OLDEST_TORCH and not gaps:
        return None
    chapters = sorted({notebook for users in gaps.values() for notebook in users})
    what = (f"it lacks {', '.join(sorted(gaps))}, so these will fail: {', '.join(chapters)}" if gaps else
            "every chapter's APIs are present, but it is untested")
    age = f"older than {oldest}, the oldest this course is tested with" if version_tuple(version) < OLDEST_TORCH \
        else f"at least {oldest}"
    return (f"torch {version} is {age}; {what}. Fix: pip install --upgrade torch torchvision "
            "(on Colab: %pip install --upgrade torch torchvision, then Runtime > Restart session)")

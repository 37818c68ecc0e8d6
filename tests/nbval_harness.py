"""pytest plugin that gives nbval the teeth this project needs (loaded by the root conftest.py).

On top of `pytest --nbval` (every stored output compared, after tests/sanitize.cfg) it makes the run fail
when a code cell has no stored run (nbval would only check that it does not raise), and when a notebook
under a folder given on the command line was not collected (a stray --ignore, a `build/` folder, ...).

It compares each cell with tools/outputs/compare.py, which says how: numbers within a tolerance, text exactly,
and the ``device-dependent``, ``build-dependent`` and ``exact`` tags; the tools that run a notebook outside pytest
compare the same way. It also writes each compared number's drift when D2L_EXT_DRIFT_LOG names a file (the matrix).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

import pytest

from tools.outputs.compare import (  # the comparison itself; this module holds nbval's hooks
    BUILD_DEPENDENT_TAG,
    BUILD_METADATA_KEY,
    DEVICE_DEPENDENT_TAG,
    MEMORY_DEPENDENT_TAG,
    MEMORY_LIMIT_VARIABLE,
    align_with_stored,
    compared_texts,
    notebooks_under,
    relative_drift,
    should_compare,
    text_at,
    tolerance_for,
    torch_build,
)

if TYPE_CHECKING:
    from nbval.plugin import IPyNbCell


class NotCollected(pytest.Item):
    """A failing item standing for a notebook that the run should have collected and did not."""

    def __init__(self, *, notebook: Path, **kwargs):
        super().__init__(**kwargs)
        self.notebook = notebook

    def runtest(self) -> None:
        raise AssertionError(
            f"{self.notebook} is under a folder given to pytest but was not collected by nbval "
            "(check --ignore options, conftest collect_ignore and pytest's norecursedirs)"
        )

    def reportinfo(self):
        return self.notebook, None, f"not collected: {self.notebook.name}"


def _is_nbval_cell(item: pytest.Item) -> TypeGuard[IPyNbCell]:
    return type(item).__name__ == "IPyNbCell"


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection, so that a partial run is still checked fairly
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    if not (config.getoption("nbval", False) or config.getoption("nbval_lax", False)):
        return
    cells = [item for item in items if _is_nbval_cell(item)]

    collected = {Path(item.path).resolve() for item in cells}
    for arg in config.args:
        folder = Path(arg.split("::")[0])
        if folder.is_dir():
            for notebook in notebooks_under(folder):
                if notebook.resolve() not in collected:
                    items.append(NotCollected.from_parent(session, name=f"not-collected[{notebook}]",
                                                          notebook=notebook))

    has_accelerator = None
    for item in cells:
        cell = item.cell
        if cell.execution_count is None and cell.source.strip():
            item.add_marker(pytest.mark.no_stored_run)
        tags = list(cell.metadata.get("tags", []))
        if MEMORY_DEPENDENT_TAG in tags and os.environ.get(MEMORY_LIMIT_VARIABLE):
            item.options["check"] = False  # run in Binder's memory, it may take another branch than the stored run
        if DEVICE_DEPENDENT_TAG in tags or BUILD_DEPENDENT_TAG in tags:
            if has_accelerator is None:  # import torch only when a notebook needs the answer
                import d2l_ext

                has_accelerator = d2l_ext.num_gpus() > 0
            stored_build = item.parent.nb.metadata.get(BUILD_METADATA_KEY, {}).get("torch_build")
            if not should_compare(tags, has_accelerator, same_build=stored_build == torch_build()):
                item.options["check"] = False


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _is_nbval_cell(item) and item.get_closest_marker("no_stored_run"):
        pytest.fail(
            f"{item.path.name} cell {item.cell_num} has no stored run (execution_count is null), so its "
            "output cannot be compared: run `make outputs` and commit the notebook",
            pytrace=False,
        )
    if _is_nbval_cell(item):
        try:
            tolerance_for(item.cell.metadata)
        except ValueError as error:
            pytest.fail(f"{item.path.name} cell {item.cell_num}: {error}", pytrace=False)


def _compare_with_tolerance(self, test, ref, skip_compare=None):
    """nbval's IPyNbCell.compare_outputs, after numbers within the cell's tolerance are aligned with the stored."""
    assert _nbval_compare_outputs is not None, "pytest_configure wraps nbval's method first"
    tolerance = tolerance_for(self.cell.metadata)
    if os.environ.get(DRIFT_LOG_VARIABLE):
        _log_drift(self, test, ref, Path(os.environ[DRIFT_LOG_VARIABLE]))
    return _nbval_compare_outputs(self, align_with_stored(test, ref, self.sanitize, tolerance), ref, skip_compare)


# `make test-matrix` sets this to a file: each compared text whose numbers moved is logged there, with how far
DRIFT_LOG_VARIABLE = "D2L_EXT_DRIFT_LOG"


def _log_drift(item, test, ref, log: Path) -> None:
    stored_kinds, fresh_kinds = {}, {}
    for outputs, kinds in ((ref, stored_kinds), (test, fresh_kinds)):
        for output in outputs:
            for place in compared_texts(output):
                kinds.setdefault((output.get("name"), place), []).append(item.sanitize(text_at(output, place)))
    path = Path(item.path)
    notebook = str(path.relative_to(item.config.rootpath)) if path.is_relative_to(item.config.rootpath) else str(path)
    with log.open("a", encoding="utf-8") as file:
        for kind, stored_texts in stored_kinds.items():
            for stored, fresh in zip(stored_texts, fresh_kinds.get(kind, []), strict=False):
                if stored != fresh:
                    drift = relative_drift(stored, fresh)
                    file.write(json.dumps({"notebook": notebook,
                                           "cell": item.cell_num, "drift": drift,
                                           "stored": stored[-300:], "fresh": fresh[-300:]}) + "\n")


_nbval_compare_outputs: Callable | None = None  # nbval's own method, kept by pytest_configure


def pytest_configure(config: pytest.Config) -> None:
    global _nbval_compare_outputs
    config.addinivalue_line("markers", "no_stored_run: a notebook code cell committed without outputs")
    # nbval has no hook for the comparison of one output: wrap its method, once per process
    from nbval.plugin import IPyNbCell

    if IPyNbCell.compare_outputs is not _compare_with_tolerance:
        _nbval_compare_outputs = IPyNbCell.compare_outputs
        IPyNbCell.compare_outputs = _compare_with_tolerance

"""pytest plugin that gives nbval the teeth this project needs (loaded by the root conftest.py).

On top of `pytest --nbval` (every stored output compared, after tests/sanitize.cfg) it makes the run fail
when a code cell has no stored run (nbval would only check that it does not raise), and when a notebook
under a folder given on the command line was not collected (a stray --ignore, a `build/` folder, ...).

Cells tagged ``device-dependent`` (those behind ``d2l_ext.needs_gpus``, or that print which device was
found) are compared on a machine without an accelerator, where the stored outputs are made; on a GPU
machine they run, and an error still fails them, but their output is not compared.
"""

from __future__ import annotations

from pathlib import Path

import pytest

DEVICE_DEPENDENT_TAG = "device-dependent"


def notebooks_under(folder: Path) -> list[Path]:
    """Return the notebooks a reader sees under ``folder`` (checkpoint copies excluded)."""
    return sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def should_compare(tags: list[str], has_accelerator: bool) -> bool:
    """Return whether a cell's stored output is compared on this machine (if nbval would compare it)."""
    return not (DEVICE_DEPENDENT_TAG in tags and has_accelerator)


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


def _is_nbval_cell(item: pytest.Item) -> bool:
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
        if DEVICE_DEPENDENT_TAG in tags:
            if has_accelerator is None:  # import torch only when a notebook needs the answer
                import d2l_ext

                has_accelerator = d2l_ext.num_gpus() > 0
            if not should_compare(tags, has_accelerator):
                item.options["check"] = False


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("no_stored_run"):
        pytest.fail(
            f"{item.path.name} cell {item.cell_num} has no stored run (execution_count is null), so its "
            "output cannot be compared: run `make outputs` and commit the notebook",
            pytrace=False,
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "no_stored_run: a notebook code cell committed without outputs")

"""Fixtures for every test under tests/ (the notebooks' harness is the root conftest.py's)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_hang_dump(monkeypatch):
    """The tests' own launches time out on purpose: they write no stacks into the file CI prints at its end
    (D2L_EXT_HANG_DUMP, .ci/run), which is for launches that hang in the notebooks."""
    monkeypatch.delenv("D2L_EXT_HANG_DUMP", raising=False)

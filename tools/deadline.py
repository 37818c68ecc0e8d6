"""CI's budget, as the optional passes see it: ``.ci/run`` exports the time past which they start nothing more.

``.ci/run`` reads ``CI_BUDGET_MINUTES`` (default 60; make test and lint always run whole) and exports
``D2L_EXT_CI_DEADLINE``, seconds since the epoch. The matrix (per run) and check-memory (per notebook) call
``past_deadline`` before they start the next piece of work: past it, they report that piece as ``NOT RUN`` and
go on, and it counts as neither passed nor failed. Outside CI the variable is unset and nothing is ever skipped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

DEADLINE_VARIABLE = "D2L_EXT_CI_DEADLINE"


def deadline(environ: Mapping[str, str] | None = None) -> float | None:
    """The deadline CI set (seconds since the epoch), or None. A value that is not a number is an error."""
    value = (os.environ if environ is None else environ).get(DEADLINE_VARIABLE, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{DEADLINE_VARIABLE} must be seconds since the epoch, not {value!r}") from None


def past_deadline(environ: Mapping[str, str] | None = None, now: float | None = None) -> bool:
    """Whether CI's budget is spent: the next optional piece of work must not start."""
    end = deadline(environ)
    # the real clock: a process under make test-matrix's stretched clocks (an xdist worker) would read CI's budget
    # as spent up to 3 times early (tools/checks/pretend/sitecustomize.py keeps the real one as time.real_time)
    real_time = getattr(time, "real_time", time.time)
    return end is not None and (real_time() if now is None else now) >= end


def not_run(what: str) -> str:
    """The line that names a piece of work CI's budget left out."""
    return f"NOT RUN: {what} (CI's budget was spent: CI_BUDGET_MINUTES)"

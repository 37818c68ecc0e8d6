"""How a fresh output is compared with a stored one: numbers within a tolerance, text exactly, tags obeyed.

The nbval plugin (tests/nbval_harness.py) compares every cell with these functions, and so do the tools that run a
notebook outside pytest: make outputs (keeps a stored output that still matches), check-timing --twice and
make gpu-check. No library does this: nbval compares text exactly, nbmake and pytest-notebook compare no numbers
within a tolerance.

Cells tagged ``device-dependent`` (those behind ``d2l_ext.needs_gpus``, or that print which device was
found) are compared on a machine without an accelerator, where the stored outputs are made; on a GPU
machine they run, and an error still fails them, but their output is not compared. Cells tagged
``build-dependent`` (they print what the torch build says: its CUDA version, its error without a driver) are
compared only under the torch build that stored them, which ``make outputs`` records in the notebook's metadata.

Numbers are compared with a tolerance, text exactly. Another CPU (AVX-512 or AMX instead of AVX2, another thread
count, Apple's Accelerate instead of MKL) rounds floating-point sums differently, so a stored ``0.4892`` may be
printed ``0.4897`` on a correct checkout. Every number with a decimal point or an exponent inside a compared
output (after tests/sanitize.cfg) matches its stored value within ``DEFAULT_TOLERANCE``; integers (counts, shapes,
sizes), words, dtypes, device names and booleans compare exactly, and so does a digit that is part of a name
(``cuda:0``, ``float32``, ``fc1``, ``0x...``). The numbers are found and compared by pytest-doctestplus's
``FLOAT_CMP`` output checker. A cell may widen the tolerance through its metadata, with a reason::

    "tolerance": {"rtol": 0.03, "reason": "bfloat16 autocast rounds differently on CPUs with AMX"}

A cell tagged ``exact`` compares its numbers exactly (no tolerance): for outputs that are the same on every
machine by construction, such as the simulated device's times (``d2l_ext.simqueue``, a virtual clock).
"""

from __future__ import annotations

import copy
import doctest
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_doctestplus.output_checker import FLOAT_CMP, OutputChecker

DEVICE_DEPENDENT_TAG = "device-dependent"
EXACT_TAG = "exact"
BUILD_DEPENDENT_TAG = "build-dependent"
# a cell whose output follows the memory the machine gives (chapter 9 starts fewer processes in Binder's 2 GB);
# not compared where a memory limit is set below the stored run's: under tools/checks/memory_nbval.py, which sets
# MEMORY_LIMIT_VARIABLE for its kernels
MEMORY_DEPENDENT_TAG = "memory-dependent"
MEMORY_LIMIT_VARIABLE = "D2L_EXT_MEMORY_LIMIT"  # the bytes of the limit the kernels run under
# where `make outputs` records the torch build that made a notebook's stored outputs
BUILD_METADATA_KEY = "d2l_ext"


@dataclass(frozen=True)
class Tolerance:
    """How far a number printed by a fresh run may be from the stored one: |fresh - stored| <= atol + rtol*|stored|."""

    rtol: float
    atol: float


# 0.5%: the largest drift measured between CPUs on a compared value is 0.22% (a DDP training loss after 80
# steps at lr 0.8); a changed seed, a wrong formula or a loop that stops learning moves numbers by far more.
# atol: differences of float32 round-off printed near zero (e.g. 3e-08 against 0.0) are not regressions.
DEFAULT_TOLERANCE = Tolerance(rtol=5e-3, atol=1e-6)
# cells tagged EXACT_TAG: outputs that cannot vary (a simulation on a virtual clock), so any change is a regression
EXACT = Tolerance(rtol=0.0, atol=0.0)


class NumberChecker(OutputChecker):
    """pytest-doctestplus's FLOAT_CMP checker, with integers compared exactly: a count or a shape must not drift."""

    def __init__(self, tolerance: Tolerance):
        super().__init__()
        self.rtol, self.atol = tolerance.rtol, tolerance.atol

    def equal_floats(self, a: str, b: str) -> bool:
        if _INTEGER.fullmatch(a) or _INTEGER.fullmatch(b):
            return a.lstrip("+") == b.lstrip("+")
        return bool(super().equal_floats(a, b))

    def match(self, stored: str, fresh: str) -> bool:
        """Return whether ``fresh`` equals ``stored`` but for numbers within the tolerance (whitespace exact)."""
        return self.check_output(stored, fresh, FLOAT_CMP | doctest.DONT_ACCEPT_BLANKLINE)


_INTEGER = re.compile(r"[+-]?\d+")


def tolerance_for(metadata: dict) -> Tolerance:
    """Return a cell's tolerance: the default, the wider one its metadata asks for with a reason, or none at all
    for a cell tagged ``exact``.

    Raises ValueError for a malformed request: unknown keys, no one-line reason, or a tolerance tighter than the
    default (a cell may only widen it; the default is the contract for every cell).
    """
    request = metadata.get("tolerance")
    if EXACT_TAG in metadata.get("tags", []):
        if request is not None:
            raise ValueError(f"a cell tagged {EXACT_TAG!r} compares numbers exactly: it cannot ask for a tolerance")
        return EXACT
    if request is None:
        return DEFAULT_TOLERANCE
    if not isinstance(request, dict) or set(request) - {"rtol", "atol", "reason"}:
        raise ValueError(f"cell metadata 'tolerance' must be a dict of rtol, atol and reason, not {request!r}")
    reason = request.get("reason")
    if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
        raise ValueError("cell metadata 'tolerance' needs a one-line 'reason' saying why this cell varies more")
    tolerance = Tolerance(rtol=float(request.get("rtol", DEFAULT_TOLERANCE.rtol)),
                          atol=float(request.get("atol", DEFAULT_TOLERANCE.atol)))
    if tolerance.rtol < DEFAULT_TOLERANCE.rtol or tolerance.atol < DEFAULT_TOLERANCE.atol:
        raise ValueError(f"cell metadata 'tolerance' {request!r} is tighter than the default {DEFAULT_TOLERANCE}")
    return tolerance


# what nbval leaves out of a comparison (IPyNbFile.skip_compare, without --nbdime): raster images are not compared
NOT_COMPARED = {"output_type", "name", "metadata", "traceback", "execution_count", "transient", "prompt_number",
                "image/png", "image/jpeg", "application/vnd.jupyter.widget-view+json"}


def compared_texts(output: dict) -> list[tuple[str | None, str]]:
    """Return the places in one output whose text nbval compares: (key under 'data' or None, key)."""
    places: list[tuple[str | None, str]] = []
    for key, value in output.items():
        if key in NOT_COMPARED:
            continue
        if key == "data":
            places += [("data", mime) for mime, text in value.items()
                       if isinstance(text, str) and mime not in NOT_COMPARED]
        elif isinstance(value, str):
            places.append((None, key))
    return places


def text_at(output: dict, place: tuple[str | None, str]) -> str:
    return output[place[0]][place[1]] if place[0] else output[place[1]]


def set_text_at(output: dict, place: tuple[str | None, str], text: str) -> None:
    if place[0]:
        output[place[0]][place[1]] = text
    else:
        output[place[1]] = text


def align_with_stored(fresh: Sequence[dict], stored: Sequence[dict], sanitize: Callable[[str], str],
                      tolerance: Tolerance) -> list[dict]:
    """Return a copy of ``fresh`` in which every text that matches its stored counterpart within ``tolerance``
    (both sanitized) is replaced by the stored text, so that nbval's exact comparison then passes on it.

    Texts are paired as nbval pairs them: the n-th output of a kind (stdout, stderr, a MIME type, ...) with the
    n-th stored one. A text that differs beyond the tolerance, or in a word, is left as it is, and nbval reports it.
    """
    checker = NumberChecker(tolerance)
    aligned = [copy.deepcopy(output) for output in fresh]

    def by_kind(outputs: Sequence[dict]) -> dict[tuple, list[tuple[dict, tuple[str | None, str]]]]:
        kinds: dict[tuple, list] = {}
        for output in outputs:
            for place in compared_texts(output):
                kind = (output.get("output_type") == "stream" and output.get("name"), place)
                kinds.setdefault(kind, []).append((output, place))
        return kinds

    stored_kinds = by_kind(stored)
    for kind, fresh_texts in by_kind(aligned).items():
        pairs = zip(fresh_texts, stored_kinds.get(kind, []), strict=False)  # a count that differs fails in nbval
        for (output, place), (stored_output, stored_place) in pairs:
            fresh_text, stored_text = text_at(output, place), text_at(stored_output, stored_place)
            if fresh_text != stored_text and checker.match(sanitize(stored_text), sanitize(fresh_text)):
                set_text_at(output, place, stored_text)
    return aligned


def outputs_match(fresh: Sequence[dict], stored: Sequence[dict], sanitize: Callable[[str], str],
                  tolerance: Tolerance) -> bool:
    """Return whether nbval would find ``fresh`` equal to ``stored`` with this harness (for tools outside pytest)."""
    from nbformat import from_dict
    from nbval.plugin import coalesce_streams  # as nbval does: a stream may arrive in more or fewer pieces

    def coalesced(outputs: Sequence[dict]) -> list:
        return coalesce_streams([from_dict(copy.deepcopy(dict(output))) for output in outputs])

    fresh, stored = coalesced(fresh), coalesced(stored)

    def compared(outputs: Sequence[dict]) -> dict[tuple, list[str]]:
        texts: dict[tuple, list[str]] = {}
        for output in outputs:
            for place in compared_texts(output):
                kind = (output.get("output_type") == "stream" and output.get("name"), place)
                texts.setdefault(kind, []).append(sanitize(text_at(output, place)))
        return texts

    return compared(align_with_stored(fresh, stored, sanitize, tolerance)) == compared(stored)


def compared_cell(cell: dict) -> bool:
    """Return whether nbval compares this code cell's output at all (no ignore or skip marker)."""
    tags = cell.get("metadata", {}).get("tags", [])
    if "nbval-ignore-output" in tags or "nbval-skip" in tags:
        return False
    return not re.search(r"^\s*#\s*NBVAL_(IGNORE_OUTPUT|SKIP)\s*$", cell.get("source", ""), flags=re.M)


def relative_drift(stored: str, fresh: str) -> float | None:
    """Return the largest relative difference between paired numbers of two texts that are equal but for their
    numbers (0.0 when identical), or None when they differ in words or in how many numbers they hold."""
    checker = NumberChecker(Tolerance(rtol=0.0, atol=float("inf")))  # any numbers, the same words
    if not checker.match(stored, fresh):
        return None
    pairs = zip(checker.find_numbers(stored), checker.find_numbers(fresh), strict=True)
    return max((abs(float(a) - float(b)) / max(abs(float(a)), 1e-12) for a, b in pairs if a != b), default=0.0)


def torch_build() -> str:
    """Return the torch build that outputs depend on: its version with the local suffix (``2.14.1+cu130``)."""
    import torch

    return str(torch.__version__)


def notebooks_under(folder: Path) -> list[Path]:
    """Return the notebooks a reader sees under ``folder`` (checkpoint copies excluded)."""
    return sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def should_compare(tags: list[str], has_accelerator: bool, same_build: bool = True,
                   memory_limited: bool = False) -> bool:
    """Return whether a cell's stored output is compared on this machine (if nbval would compare it)."""
    if DEVICE_DEPENDENT_TAG in tags and has_accelerator:
        return False
    if MEMORY_DEPENDENT_TAG in tags and memory_limited:
        return False
    return not (BUILD_DEPENDENT_TAG in tags and not same_build)

"""A stand-in for triton where it has no wheels (macOS, native Windows): chapter 12's kernels can be defined
(``@triton.jit``, ``tl.constexpr``), and the cells that would run them print one line instead
(``kernels.needs_triton``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable)
__version__ = "missing"


def jit(fn: F) -> F:
    """Return ``fn`` unchanged: without Triton a kernel is an ordinary function, never launched."""
    return fn


def cdiv(a: int, b: int) -> int:
    """Return the ceiling of a / b, as triton.cdiv does."""
    return -(-a // b)


def __getattr__(name: str) -> Any:
    """Any other name is Triton's own: it does not exist here."""
    raise AttributeError(f"triton.{name}: Triton is not installed here (Linux wheels only)")

"""The stand-in for triton.language (chapter 12, with ``d2l_ext.no_triton``): only what a kernel's signature
needs where Triton is not installed."""

from typing import Any

constexpr = int  # the annotation of a kernel's compile-time arguments


def __getattr__(name: str) -> Any:
    """Any other name (tl.load, tl.arange, ...) is used only inside kernels, which never run without Triton."""
    raise AttributeError(f"triton.language.{name}: Triton is not installed here (Linux wheels only)")

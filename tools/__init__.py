"""The course's tooling: how the notebooks are tested, checked, built into a book and run elsewhere (tools/README.md).

Every tool runs from the repository root as ``python -m tools.GROUP.MODULE``. Nothing in ``d2l_ext`` or the
notebooks imports from here, and nothing here imports from ``tests/``.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the repository's root

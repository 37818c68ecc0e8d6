"""Checks of the notebooks beyond nbval: the type check (make lint), and runs with torch or the clocks made to lie
(tags, timing), and Binder's memory.
"""

from tools import REPO

# the folder whose sitecustomize.py makes torch report another build or the clocks stretch: put first on PYTHONPATH
PRETEND = REPO / "tools" / "checks" / "pretend"

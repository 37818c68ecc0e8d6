"""Disk for the extra environments of `make test-matrix` and `make test-colab`.

Each environment holds a CUDA build of torch (PyPI's only Linux build): about 6 GiB, 3.2 GiB of it NVIDIA's
libraries, which are the same files for every Python. Two steps make a new environment cost about a third:

- `seed SOURCE`, run by the new environment's Python before pip: hard-links into its site-packages every
  package of SOURCE (a venv) whose wheel does not depend on the Python version (tag `py3-none-<platform>`) and
  keeps its files inside site-packages (NVIDIA's libraries). pip then finds them installed; where it needs
  another version it replaces the links, and SOURCE keeps its own files.
- `dedupe SOURCE`, after pip: replaces each file that is byte for byte the same as the file at the same path
  in SOURCE by a hard link to it (torch's CUDA libraries are the same for Python 3.10 to 3.13).

`free_gib` tells the callers whether a new environment fits; they say what they do when it does not.
`find_python` finds the other Pythons they need. This module imports nothing else of the course's: the
Makefile runs it with a new environment's Python before anything is installed there.

Usage: python -m tools.envs.venvs seed|dedupe SOURCE_VENV   (with the target environment's Python)
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

# Measured here (torch 2.14.1, Python 3.10, pip's download of torch included): a seeded venv took 3.6 GiB of
# free disk at its peak and 1.8 GiB once deduped (6.2 GiB unseeded).
SEEDED_VENV_GIB = 5.0  # what a seeded matrix environment needs free, with a margin
COLAB_VENV_GIB = 7.0  # .venv-colab: another torch (2.11), so fewer of its files can be seeded


def find_python(name: str) -> str | None:
    """Return a working interpreter called ``name`` (e.g. python3.10): on PATH, or among pyenv's versions."""
    candidates = [shutil.which(name)]  # a pyenv shim is on PATH even when its version is not selected
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in pyenv_root.glob(f"versions/{name.removeprefix('python')}*/bin/{name}"))
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import sys"], capture_output=True).returncode == 0:
            return candidate
    return None


def free_gib(path: Path) -> float:
    """Free space on the file system that holds ``path`` (or its nearest existing parent), in GiB."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free / 2**30


def site_packages(venv: Path) -> Path:
    """The site-packages folder of the venv at ``venv`` (any Python 3 version)."""
    found = sorted(Path(venv).glob("lib/python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"{venv} has no lib/python3*/site-packages: is it a venv?")
    return found[-1]


def _record(dist_info: Path) -> list[str]:
    """Paths (relative to site-packages) that the RECORD of an installed package lists."""
    record = dist_info / "RECORD"
    if not record.exists():
        return []
    return [line.split(",")[0] for line in record.read_text().splitlines() if line.strip()]


def python_independent(dist_info: Path) -> bool:
    """True for a package whose files are the same under every Python 3: its wheel is tagged py3-none or
    py2-none for a platform (not `any`: pure-Python packages may carry version-specific markers or scripts),
    and every file it installed lies inside site-packages (no scripts in bin/)."""
    wheel = dist_info / "WHEEL"
    if not wheel.exists():
        return False
    tags = [line.split(":", 1)[1].strip() for line in wheel.read_text().splitlines() if line.startswith("Tag:")]
    if not tags or not all(t.split("-")[0] in ("py3", "py2", "py2.py3") and t.split("-")[1] == "none"
                            and t.split("-")[2] != "any" for t in tags):
        return False
    paths = _record(dist_info)
    return bool(paths) and not any(p.startswith("..") or p.startswith("/") for p in paths)


def seed(source: Path, target: Path) -> int:
    """Hard-link the Python-independent packages of site-packages ``source`` into ``target``; return bytes
    linked. Files that exist in ``target`` already are left alone."""
    linked = 0
    for dist_info in sorted(source.glob("*.dist-info")):
        if not python_independent(dist_info):
            continue
        for relative in _record(dist_info):
            if "__pycache__" in relative:
                continue
            origin, copy = source / relative, target / relative
            if not origin.is_file() or copy.exists():
                continue
            copy.parent.mkdir(parents=True, exist_ok=True)
            os.link(origin, copy)
            linked += origin.stat().st_size
    return linked


def dedupe(source: Path, target: Path, smallest: int = 1 << 20) -> int:
    """Replace each file of ``target`` (at least ``smallest`` bytes) that equals the file at the same relative
    path in ``source`` by a hard link to it; return the bytes saved."""
    saved = 0
    for path in target.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        size = path.stat().st_size
        twin = source / path.relative_to(target)
        if size < smallest or not twin.is_file() or twin.stat().st_size != size:
            continue
        if os.path.samefile(path, twin) or not filecmp.cmp(path, twin, shallow=False):
            continue
        temporary = path.with_name(path.name + ".link")
        os.link(twin, temporary)
        os.replace(temporary, path)
        saved += size
    return saved


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("seed", "dedupe"):
        print((__doc__ or "").split("Usage: ")[-1].strip(), file=sys.stderr)
        return 2
    source = site_packages(Path(argv[1]))
    target = Path(sysconfig.get_paths()["purelib"])
    try:
        done = (seed if argv[0] == "seed" else dedupe)(source, target)
    except OSError as error:  # another file system: hard links cannot cross it; pip installs as usual
        print(f"venvs {argv[0]}: skipped ({error})")
        return 0
    verb = "linked from" if argv[0] == "seed" else "shared with"
    print(f"venvs {argv[0]}: {done / 2**30:.1f} GiB {verb} {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

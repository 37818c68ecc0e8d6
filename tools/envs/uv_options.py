"""Print the options that make ``uv pip install`` take packages from where pip takes them here.

tools/envs/install.sh installs with uv where it can (a fresh `.venv` in 39 s rather than pip's 117 s here, the
same packages: issue 45), and uv does not read pip's configuration. A machine whose pip is configured (a company
mirror, a folder of wheels, a cap on versions: ``pip config list``, files or ``PIP_*`` variables) would otherwise
install from PyPI, or fail. This reads pip's settings and prints uv's options for them, one per line:

- ``index-url`` -> ``--index-url`` (a variable beats a file, as in pip); ``no-index`` -> ``--no-index``;
- ``extra-index-url``, ``find-links``, ``constraint`` (each may list several) -> one option per value;
- with extra indexes, ``--index-strategy unsafe-best-match``: pip takes the best version from all indexes, uv by
  default only from the first that has the package;
- ``cert`` -> a line ``SSL_CERT_FILE=PATH``, which install.sh exports (uv reads that variable, pip its option).

Standard library only: install.sh runs it with the new environment's bare Python. Usage:
    python tools/envs/uv_options.py [PIP_CONFIG_LIST_FILE]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

MANY = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}


def settings(config_list: str) -> dict[str, list[str]]:
    """Return {key: values} from ``pip config list``'s lines (``global.key='value'``, ``:env:.key='value'``),
    the values of a variable (``:env:``) first."""
    found: dict[str, list[tuple[bool, str]]] = {}
    for line in config_list.splitlines():
        match = re.match(r"^(\S*?)\.([\w-]+)='(.*)'$", line.strip())
        if match:
            scope, key, value = match.groups()
            found.setdefault(key, []).append((scope != ":env:", value))
    return {key: [value for _, value in sorted(values, key=lambda item: item[0])] for key, values in found.items()}


def options(config_list: str) -> list[str]:
    """Return uv's options (and a ``SSL_CERT_FILE=`` line) for pip's settings in ``config_list``."""
    found = settings(config_list)
    lines = []
    if found.get("index-url"):
        lines.append(f"--index-url={found['index-url'][0]}")  # pip's own order: a variable over a file
    if found.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
        lines.append("--no-index")
    for key, option in MANY.items():
        seen: list[str] = []
        for value in found.get(key, []):
            seen += [item for item in value.split() if item not in seen]
        lines += [f"{option}={item}" for item in seen]
    if any(line.startswith("--extra-index-url=") for line in lines):
        lines.append("--index-strategy=unsafe-best-match")
    if found.get("cert"):
        lines.append(f"SSL_CERT_FILE={found['cert'][0]}")
    return lines


def main(argv: list[str]) -> int:
    if argv:
        with open(argv[0], encoding="utf-8") as file:
            config_list = file.read()
    else:
        # pip prints no settings when quiet (PIP_QUIET=1, as tools/envs/colab.py runs the recipe): -v and an
        # environment without the variable undo that; the lines -v adds are not settings, and are skipped
        environment = {key: value for key, value in os.environ.items() if key != "PIP_QUIET"}
        config_list = subprocess.run([sys.executable, "-m", "pip", "config", "list", "-v"], capture_output=True,
                                     text=True, check=False, env=environment).stdout
    found = options(config_list)
    if found:  # no line at all for an unconfigured pip: an empty one would reach uv as an empty argument
        print("\n".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

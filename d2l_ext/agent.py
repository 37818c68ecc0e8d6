"""torchrun's agent, importing what the training script imports before it forks the workers.

    python -m d2l_ext.agent [torchrun's options] --run-path --start-method=fork /abs/script.py [script's arguments]

With ``--run-path --start-method=fork`` (``launch.forks_workers``), torchrun forks each worker from its agent and
runs the script in it, so that a worker starts with every module the agent has imported. torchrun's own agent has
imported torch only: the script's other imports (torch.distributed.checkpoint, FSDP, DTensor: one to two seconds
of CPU here) would be imported again by every worker, at every restart. This agent imports them once, then runs
torchrun as ``torchrun`` (``python -m torch.distributed.run``) does. Without ``--run-path`` it is torchrun.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

from torch.distributed.run import get_args_parser
from torch.distributed.run import main as torchrun


def script_imports(script: Path) -> list[str]:
    """Return the modules that ``script`` imports at its top level, in order (relative imports left out)."""
    names: list[str] = []
    for node in ast.parse(script.read_text(), filename=str(script)).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module not in (None, "__future__"):
            names.append(str(node.module))
    return names


def preload(script: Path) -> list[str]:
    """Import what ``script`` imports at its top level; return the modules that could not be imported, which the
    workers then report themselves, where a learner looks for the error."""
    missing = []
    for name in script_imports(script):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = get_args_parser().parse_args(argv)
    if args.run_path:
        preload(Path(args.training_script))
    torchrun(argv)


if __name__ == "__main__":
    main()

"""A rank that skips a collective, and what the others see: a timeout that names nothing, or with
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` the mismatch, named at once.

    torchrun --nproc-per-node=2 scripts/hang.py skip 5                                  # rank 1 skips an all_reduce
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --nproc-per-node=2 scripts/hang.py shape 5  # the shapes differ

Every rank joins with a short timeout (the second argument, in seconds; the default is 10 minutes, or 30 with
gloo's own setting) so that a hang ends in an error instead of waiting until someone notices. ``skip``: rank 1
"forgets" the all_reduce that rank 0 makes (a branch that only some ranks take: the most common cause of a hang).
``shape``: both call all_reduce, with 4 and 5 numbers. Each rank prints what it got, without the C++ source paths
of the message, which change with every build; ``pid`` prints each rank's process id first, for ``py-spy dump``.
"""

from __future__ import annotations

import datetime
import os
import re
import sys
import time

import torch
import torch.distributed as dist

SOURCE_PATH = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


def main() -> None:
    mode, seconds = sys.argv[1], float(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=seconds))
    rank = dist.get_rank()
    if "pid" in sys.argv[3:]:
        print(f"rank {rank}: pid {os.getpid()}", flush=True)
    started = time.monotonic()
    try:
        if mode == "skip" and rank == 1:
            time.sleep(seconds + 3)  # busy elsewhere: the all_reduce below never comes
            print(f"rank {rank}: skipped the all_reduce", flush=True)
        else:
            dist.all_reduce(torch.ones(4 + (rank if mode == "shape" else 0)))
            print(f"rank {rank}: all_reduce done", flush=True)
    except RuntimeError as error:
        message = SOURCE_PATH.sub("", str(error).strip().splitlines()[0])
        print(f"rank {rank}: RuntimeError after {time.monotonic() - started:.1f} s: {message}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # not destroy_process_group: after a failed collective it may wait on the peer that never came


if __name__ == "__main__":
    main()

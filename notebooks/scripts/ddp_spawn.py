"""Start 2 processes with torch.multiprocessing.spawn instead of torchrun, and watch a hung rank time out.

    python scripts/ddp_spawn.py --timeout 2

``mp.spawn(worker, args=..., nprocs=2)`` starts 2 fresh Python processes and calls ``worker(rank, *args)`` in
each: the rank arrives as an argument, and no environment variable is set; the script itself says where the
processes meet and how many there are. Then rank 1 stops taking part (it sleeps, as a rank stuck in a deadlock,
a slow data loader or an endless loop would), and rank 0 waits in an all-reduce until the process group's
timeout ends the wait with an error. This script runs on the CPU over gloo on every machine: its point is the
timeout, which NCCL handles differently (its watchdog ends the process; see the chapter).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from d2l_ext.launch import free_port

LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def worker(rank: int, world_size: int, port: int, timeout: float) -> None:
    """Run in each spawned process; ``rank`` is the first argument mp.spawn passes."""
    set_here = [name for name in LAUNCH_VARIABLES if name in os.environ]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # both ranks take part: the sum 1 + 2
    facts: list[object] = [None] * world_size
    dist.all_gather_object(facts, (rank, set_here, total.item()))
    if rank == 0:
        for other_rank, variables, value in facts:  # type: ignore[misc]
            print(f"rank {other_rank}: got rank={other_rank} as an argument; launch variables set: {variables}; "
                  f"all_reduce gave {value:.0f}", flush=True)

    if rank == 1:
        time.sleep(timeout + 1)  # stuck: it never joins the next all-reduce (and then leaves)
    else:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(3))
        except RuntimeError as error:
            waited = time.monotonic() - start
            message = re.sub(r"^\[[^\]]*\] ", "", str(error))  # drop the source file and line of the C++ code
            print(f"rank 0 waited in all_reduce for rank 1, then: RuntimeError: {message}", flush=True)
            print(f"the wait lasted the timeout ({timeout:g} s) or longer: {waited >= timeout}", flush=True)
    # after a collective timed out, the process group cannot be shut down cleanly (gloo may abort in its
    # destructor at exit): leave at once, as a real job does after such an error, with exit code 0 for the demo
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=2, help="seconds before a collective gives up")
    args = parser.parse_args()
    world_size = 2
    # the meeting point: torchrun would pick it and export it; with mp.spawn it is ours to choose and pass on
    mp.spawn(worker, args=(world_size, free_port(), args.timeout), nprocs=world_size,  # pyright: ignore[reportPrivateImportUsage]
             join=True)
    print("both processes ended; mp.spawn returned", flush=True)


if __name__ == "__main__":
    main()

"""Chapter 8's sharding scripts: zero1.py's ranges, and what both scripts print on 2 processes.

On a machine without a GPU the scripts run on 2 CPU processes over gloo, and notebooks/08_memory.ipynb runs them
(cells 22 and 24) and compares every line they print: launching them again here would cost about 20 s of the
suite and check nothing more. So the same checks read the notebook's stored outputs (kernel-free), which nbval
holds equal to a fresh run; on a machine with GPUs, where those cells are not compared (they are tagged
device-dependent), the scripts are launched here and the checks read what they print there.
"""

from __future__ import annotations

import re

import pytest

from d2l_ext import num_gpus
from tests.helpers import CHAPTER, SCRIPTS, load_script, printed_by  # noqa: F401 (shared)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("numel", [0, 1, 3, 7, 8, 4290, 4355])
def test_the_ranges_cover_every_element_once_and_differ_by_at_most_one(numel, world_size):
    shard_range = load_script("zero1").shard_range
    ranges = [shard_range(numel, rank, world_size) for rank in range(world_size)]
    assert [start for start, _ in ranges] == [0] + [end for _, end in ranges[:-1]]  # contiguous, no overlap
    assert ranges[-1][1] == numel  # nothing left over
    sizes = [end - start for start, end in ranges]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    assert sorted(sizes, reverse=True) == sizes  # the larger ones first


def test_a_rank_outside_the_world_is_refused():
    shard_range = load_script("zero1").shard_range
    with pytest.raises(ValueError):
        shard_range(10, 2, 2)


def per_rank(output: str, verb: str) -> dict[int, tuple[int, ...]]:
    """Return {rank: (parameters it has, total, its Adam state bytes, the unsharded Adam state bytes)}."""
    found = re.findall(rf"^rank (\d+): {verb}.*?([\d,]+) of ([\d,]+)(?: parameters)?; "
                       r"Adam state ([\d,]+) B \((?:DDP|one process): ([\d,]+) B\)$", output, flags=re.M)
    return {int(r): tuple(int(n.replace(",", "")) for n in numbers) for r, *numbers in found}


def check_shares(ranks: dict[int, tuple[int, ...]]) -> None:
    assert sorted(ranks) == [0, 1]
    (owned0, total, bytes0, full_bytes), (owned1, total1, bytes1, full_bytes1) = ranks[0], ranks[1]
    assert total == total1 == 4290 and full_bytes == full_bytes1 == 2 * 4 * total  # two fp32 moments each
    assert owned0 + owned1 == total
    assert bytes0 + bytes1 == full_bytes and bytes0 == 2 * 4 * owned0


def test_zero1_matches_ddp_with_half_the_adam_state_per_rank():
    output = printed_by("zero1.py")
    if num_gpus() == 0:
        assert "2 processes, backend gloo, devices ['cpu', 'cpu']" in output
    check_shares(per_rank(output, "owns"))
    assert "the ranks' ranges cover every parameter once: True" in output
    assert "same parameters as DDP (within 1e-6): True" in output


def test_fsdp2_matches_one_process_with_half_the_parameters_per_rank():
    output = printed_by("fsdp2.py")
    check_shares(per_rank(output, "holds"))
    assert "global (64, 64), local (32, 64), sharded along dim 0" in output
    losses = re.search(r"FSDP2 ([\d.]+) -> ([\d.]+), one process ([\d.]+) -> ([\d.]+)", output)
    assert losses is not None
    first, last, first_reference, last_reference = map(float, losses.groups())
    assert (first, last) == (first_reference, last_reference) and last < first  # it learns, as one process does
    assert "same loss as one process (within 1e-5), every step: True" in output
    assert "same parameters as one process (within 1e-5): True" in output

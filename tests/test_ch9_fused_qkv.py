"""Chapter 9's exercise 4: scripts/tensor_parallel.py --fused-qkv fuses the block's q, k and v into one layer, laid
out head by head so that a column split still gives each rank whole heads. The solution notebook shows the change
and this test's result; the launch runs here, not in the notebook (a launch costs CI about six times its 10-20 s)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from d2l_ext import launch
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "scripts" / "tensor_parallel.py"


def test_fusing_lays_q_k_and_v_out_head_by_head():
    script = load_script("tensor_parallel")
    q, k, v = (torch.arange(16.0).reshape(16, 1) + offset for offset in (0, 100, 200))
    fused = script.fuse(q, k, v).flatten().tolist()
    # head 0: q's rows 0-3, k's 0-3, v's 0-3; then head 1, ...
    assert fused[:12] == [0, 1, 2, 3, 100, 101, 102, 103, 200, 201, 202, 203]
    assert fused[12:16] == [4, 5, 6, 7] and len(fused) == 48
    # the first half, rank 0's at a degree of 2, holds heads 0 and 1 with their q, k and v, and nothing else
    assert sorted(fused[:24]) == [*range(8), *range(100, 108), *range(200, 208)]


def test_the_fused_block_computes_what_the_block_computes_in_one_process():
    script = load_script("tensor_parallel")
    block = script.full_block(torch.device("cpu"))
    fused = script.FusedBlock(block)
    x = torch.randn(2, script.SEQUENCE, script.HIDDEN)
    assert torch.allclose(fused(x), block(x), atol=1e-6, rtol=0)
    assert len(list(fused.parameters())) == 12 and len(list(block.parameters())) == 16


@pytest.mark.launches
def test_with_fused_qkv_the_backward_all_reduces_fall_from_4_to_2():
    output = launch.torchrun(SCRIPT, nproc=2, args=["--fused-qkv"], timeout=180, echo=False)
    assert output.startswith("2 processes, backend ")
    assert "-- transformer block, q, k and v fused --\n" in output
    assert "transformer block: rank 0 computes 2 of 4 heads, qkv's weight (24, 16) of (48, 16)" in output
    assert "same output, input's gradient and 12 parameters' gradients as one process (within 1e-6): True" in output
    # forward: the output projection's and the MLP's all-reduce, as before; backward: one for qkv, one for the MLP's
    # first layer (4 with q, k and v apart), whether the input needs a gradient or not (the LayerNorms' weights do)
    assert "  block: {'all_reduce': 2} / {'all_reduce': 2} / {'all_reduce': 2}\n" in output
    assert "-- by hand --" not in output  # only the block runs

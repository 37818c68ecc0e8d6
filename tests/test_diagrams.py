"""d2l_ext.diagrams: the ring all-reduce and the bucket schedule behind chapter 6's pictures, and the pictures."""

from __future__ import annotations

import matplotlib
import pytest

from d2l_ext import diagrams, roofline

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only

matplotlib.use("Agg")


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_ring_ends_with_every_sum_on_every_gpu(n):
    states = diagrams.ring_allreduce_steps(n)
    everyone = frozenset(range(n))
    assert len(states) == 1 + 2 * (n - 1)
    assert all(chunk == frozenset({g}) for g, row in enumerate(states[0]) for chunk in row)
    after_reduce_scatter = states[n - 1]
    for g in range(n):  # GPU g holds the complete sum of chunk g + 1, and only of that chunk
        complete = [c for c in range(n) if after_reduce_scatter[g][c] == everyone]
        assert complete == [(g + 1) % n]
    assert all(chunk == everyone for row in states[-1] for chunk in row)


def test_each_step_moves_one_chunk_per_gpu():
    n = 4
    states = diagrams.ring_allreduce_steps(n)
    for before, after in zip(states, states[1:], strict=False):
        changed = [(g, c) for g in range(n) for c in range(n) if before[g][c] != after[g][c]]
        assert len(changed) == n and sorted(g for g, _ in changed) == list(range(n))  # each GPU receives one


def test_buckets_overlap_the_backward_pass():
    backward = [2.0] * 6
    overlapped = diagrams.bucket_schedule(backward, [2, 2, 2], [2.5] * 3)
    alone = diagrams.bucket_schedule(backward, [6], [7.5])
    reduces = [i for i in overlapped if i.lane == "all-reduce"]
    assert [(i.start, i.end) for i in reduces] == [(4.0, 6.5), (8.0, 10.5), (12.0, 14.5)]  # after their layers
    assert max(i.end for i in overlapped) == 14.5 and max(i.end for i in alone) == 19.5
    waiting = diagrams.bucket_schedule([1.0] * 4, [1, 1, 1, 1], [3.0] * 4)  # slow link: all-reduces queue up
    assert [i.start for i in waiting if i.lane == "all-reduce"] == [1.0, 4.0, 7.0, 10.0]
    with pytest.raises(ValueError):
        diagrams.bucket_schedule(backward, [2, 2], [1.0, 1.0])


def test_the_pictures_show_what_the_algorithms_computed():
    import matplotlib.pyplot as plt

    ring = diagrams.draw_ring_allreduce(3)
    assert [ax.get_title() for ax in ring.axes] == ["start", "reduce-scatter 1", "reduce-scatter 2", "all-gather 1",
                                                     "all-gather 2"]
    assert [t.get_text() for t in ring.axes[-1].texts] == ["0+1+2"] * 9
    buckets = diagrams.draw_ddp_buckets()
    assert "step done\nat 14.5 ms" in [t.get_text() for t in buckets.axes[0].texts]
    assert "step done\nat 19.5 ms" in [t.get_text() for t in buckets.axes[1].texts]
    step = diagrams.draw_data_parallel_step()
    assert {"gradient 0", "gradient 1"} <= {t.get_text() for t in step.texts}
    plt.close("all")


def test_the_allocator_picture_adds_up():
    import matplotlib.pyplot as plt

    numbers = diagrams.allocator_numbers(diagrams.ALLOCATOR_SEGMENTS, 10)
    assert numbers == {"allocated": 24, "reserved": 40, "cached": 16, "largest free block": 8, "fits": False}
    assert diagrams.allocator_numbers(diagrams.ALLOCATOR_SEGMENTS, 8)["fits"] is True
    ax = diagrams.draw_caching_allocator()
    assert "memory_allocated 24 MiB, memory_reserved 40 MiB" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["allocated (live tensors): 24 MiB",
                                                                   "cached, free: 16 MiB"]
    plt.close("all")


def test_the_host_and_devices_picture_names_the_parts():
    import matplotlib.pyplot as plt

    texts = {t.get_text() for t in diagrams.draw_host_and_devices().texts}
    assert {"host: torch.device('cpu')", "GPU 0 (physical)", "GPU 1 (physical)"} <= texts
    assert any("CUDA_VISIBLE_DEVICES=1 only GPU 1, as cuda:0" in t for t in texts)
    plt.close("all")


def test_the_copy_map_names_every_path():
    import matplotlib.pyplot as plt

    texts = " ".join(t.get_text() for t in diagrams.draw_copy_paths().texts)
    for part in ("pageable memory", "pinned (page-locked) memory", "copy\nengine", "peer to peer",
                 "goes through host memory", "Apple silicon"):
        assert part in texts
    plt.close("all")


def test_the_splits_picture_gives_each_rank_its_half():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    tensor, sequence, pipeline = diagrams.draw_model_splits()
    colours = {c: i for i, c in enumerate(diagrams.RANK_COLOURS)}

    def owners(ax):  # label -> the rank whose colour its box has (None: every rank); a box's label comes after it
        return {text.get_text(): colours.get(to_hex(box.get_facecolor(), keep_alpha=False).upper())
                for text, box in zip(ax.texts, ax.patches, strict=False)}

    assert owners(tensor) == {"X\n(all)": None, "A₀": 0, "A₁": 1, "B₀": 0, "B₁": 1, "Y₀+Y₁\nall-reduce": None}
    assert [owners(pipeline)[f"layer {i}"] for i in range(4)] == [0, 0, 1, 1]
    assert len(sequence.patches) == 16  # 8 tokens before the MLP, 8 after, half on each rank
    plt.close("all")


def test_the_gpu_picture_names_each_level_and_its_h100_figures():
    import matplotlib.pyplot as plt

    texts = " ".join(t.get_text() for t in diagrams.draw_gpu().texts)
    for part in ("HBM3\n80 GB", "3.35 TB/s", "L2 cache\n50 MB", "132 SMs", "registers: 256 KB", "up to 228 KB",
                 "Tensor\nCore", "warps: groups of 32 threads", "PCIe Gen5"):
        assert part in texts
    assert "3.35 TB/s" in texts and roofline.GPUS["H100"].bandwidth == 3.35e12  # the picture and the table agree
    plt.close("all")

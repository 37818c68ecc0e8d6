"""d2l_ext.diagrams_parallel: chapter 9's pictures of tensor parallelism, checked against what they claim."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from d2l_ext import diagrams_parallel  # noqa: E402


def test_each_pass_communicates_once_g_forward_and_f_backward():
    # as scripts/tensor_parallel.py counts them: all-reduces forward ['g forward'], backward ['f backward']
    for name, where in (("forward", "g"), ("backward", "f")):
        communicating = [label for label, _, communicates in diagrams_parallel.TP_STEPS[name] if communicates]
        assert communicating == [where]
    labels = [label for label, _, _ in diagrams_parallel.TP_STEPS["forward"]]
    assert labels.index("f") < labels.index("rank") < labels.index("g")  # f before the split layers, g after


def test_sequence_parallelism_gathers_before_the_split_mlp_and_reduce_scatters_after():
    # as the script counts them: TP+SP {'all_gather_into_tensor': 1, 'reduce_scatter_tensor': 1}, no all-reduce
    labels = [label for label, _, _ in diagrams_parallel.SP_STEPS]
    communicating = [label for label, _, communicates in diagrams_parallel.SP_STEPS if communicates]
    assert communicating == ["all-gather", "reduce-scatter"]
    assert labels.index("LayerNorm") < labels.index("all-gather") < labels.index("rank") < labels.index(
        "reduce-scatter") < labels.index("dropout")


def test_every_element_of_each_weight_is_on_one_rank_of_the_mesh():
    for shape, style in (((64, 16), "colwise"), ((16, 64), "rowwise")):
        held = [(r, c) for rank in range(4)
                for rows, columns in [diagrams_parallel.mesh_rows_and_columns(*shape, style, 2, 2, rank)]
                for r in rows for c in columns]
        assert sorted(held) == [(r, c) for r in range(shape[0]) for c in range(shape[1])]
    # FSDP2 splits the tensor-parallel part again (torch 2.14: _StridedShard(0) over dp, Shard(0) over tp), so
    # rank 1 (dp 0, tp 1) holds rows 32 to 47 of the first weight, not 16 to 31
    assert diagrams_parallel.mesh_rows_and_columns(64, 16, "colwise", 2, 2, 1) == (range(32, 48), range(16))
    assert diagrams_parallel.mesh_rows_and_columns(16, 64, "rowwise", 2, 2, 2) == (range(8, 16), range(32))


def test_the_pictures_draw_their_boxes():
    axes = diagrams_parallel.draw_tensor_parallel()
    assert [len(ax.patches) for ax in axes] == [6, 6]  # X, f, two ranks, g, Y; and backward's
    ax = diagrams_parallel.draw_sequence_parallel()
    assert len(ax.patches) == 8  # LayerNorm, MLP and dropout once per rank, the two collectives across both
    axes = diagrams_parallel.draw_mesh_shards()
    assert [len(ax.patches) for ax in axes] == [4, 4]
    plt.close("all")

"""Chapter 9's pictures of tensor parallelism: where Megatron's f and g communicate in a forward and a backward
pass, how sequence parallelism changes the tokens' layout around the split MLP, and which rows and columns of each
weight every rank of a (dp, tp) = (2, 2) mesh holds. Each is drawn from data (TP_STEPS, SP_STEPS,
mesh_rows_and_columns) that tests check against what scripts/tensor_parallel.py counts."""

from __future__ import annotations

from typing import Any

from .diagrams import RANK_COLOURS

# the Megatron MLP's steps in each pass, in the order they run: (label, what it does, communicates); "rank" marks
# the steps each rank runs on its own half of the weights
TP_STEPS = {
    "forward": [("X", "whole, on every rank", False), ("f", "identity", False),
                ("rank", "GELU(X Aᵢ) Bᵢ", False), ("g", "all-reduce: Y = Σ Yᵢ", True), ("Y", "whole", False)],
    "backward": [("∂Y", "whole, on every rank", False), ("g", "identity", False),
                 ("rank", "through Bᵢ, GELU, Aᵢ", False), ("f", "all-reduce: ∂X = Σ ∂Xᵢ", True),
                 ("∂X", "whole", False)],
}
# sequence parallelism's forward pass through LayerNorm and the MLP on two ranks of a sequence of 8 tokens
SP_STEPS = [("LayerNorm", "tokens {half} of 8", False), ("all-gather", "every rank: all 8 tokens", True),
            ("rank", "A, B half {rank};\nall 8 tokens", False),
            ("reduce-scatter", "sum, then each rank: its tokens", True), ("dropout", "tokens {half} of 8", False)]
MESH_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52")  # ranks 0 to 3 of the (2, 2) mesh


def _draw_steps(ax: Any, steps: list[tuple[str, str, bool]], title: str, backward: bool = False,
                per_rank: tuple[str, ...] = ("rank",)) -> None:
    """Draw ``steps`` left to right (right to left if ``backward``): a step named in ``per_rank`` as one box per rank
    (its text formatted with ``rank`` and ``half``, the tokens that rank holds), any other as one box across both,
    red where it communicates."""
    from matplotlib.patches import FancyBboxPatch

    ax.set_xlim(0, 10)
    ax.set_ylim(0, 3)
    ax.axis("off")
    xs = [0.9 + i * 2.05 for i in range(len(steps))]
    if backward:
        xs = xs[::-1]  # backward runs from the output to the input
    for x, (label, what, communicates) in zip(xs, steps, strict=True):
        if label in per_rank:
            for rank, y in ((0, 1.95), (1, 0.55)):
                text = what.replace("ᵢ", "₀₁"[rank]).format(rank=rank, half=("0-3", "4-7")[rank])
                ax.add_patch(FancyBboxPatch((x - 0.85, y), 1.7, 0.8, boxstyle="round,pad=0.02",
                                            facecolor=RANK_COLOURS[rank], edgecolor="black", linewidth=0.6))
                ax.text(x, y + 0.4, (f"rank {rank}:\n" if label == "rank" else f"{label}, rank {rank}:\n") + text,
                        ha="center", va="center", fontsize=7, color="white", wrap=True)
            continue
        colour = "#F4CCCC" if communicates else "white" if label in "fg" else "lightgray"
        ax.add_patch(FancyBboxPatch((x - 0.85, 0.55), 1.7, 2.2, boxstyle="round,pad=0.02", facecolor=colour,
                                    edgecolor="#C00000" if communicates else "black",
                                    linewidth=1.4 if communicates else 0.6))
        ax.text(x, 1.85, label, ha="center", va="center", fontsize=11 if len(label) < 4 else 8.5, fontweight="bold")
        ax.text(x, 1.05, what.replace(": ", ":\n").replace(", then ", ",\nthen "), ha="center", va="center",
                fontsize=7.5)
    for left, right in zip(xs, xs[1:], strict=False):
        ax.annotate("", xy=(right - 0.9 if right > left else right + 0.9, 1.65),
                    xytext=(left + 0.9 if right > left else left - 0.9, 1.65),
                    arrowprops={"arrowstyle": "->", "linewidth": 0.8})
    ax.set_title(title, fontsize=9)


def draw_tensor_parallel(axes: Any = None) -> Any:
    """Draw the Megatron MLP on two ranks, forward pass (top) then backward pass (bottom, right to left): each rank
    computes with its half of A and B; f and g are marked, and the one step of each pass that communicates (an
    all-reduce spanning both ranks) is drawn in red."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(10, 3.6))
    for ax, (name, steps) in zip(axes, TP_STEPS.items(), strict=True):
        _draw_steps(ax, steps, f"{name} pass" + (", from the output back" if name == "backward" else ""),
                    backward=name == "backward")
    return axes


def draw_sequence_parallel(ax: Any = None) -> Any:
    """Draw sequence parallelism's forward pass on two ranks: LayerNorm and dropout on each rank's half of the
    tokens, an all-gather before the tensor-parallel MLP and a reduce-scatter after it (in red)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.2))
    _draw_steps(ax, SP_STEPS, "sequence parallelism, forward pass: the tokens' layout on each rank",
                per_rank=("rank", "LayerNorm", "dropout"))
    return ax


def mesh_rows_and_columns(out_features: int, in_features: int, style: str, dp: int, tp: int,
                          rank: int) -> tuple[range, range]:
    """The rows and columns of a (out_features, in_features) weight that ``rank`` of a (dp, tp) mesh holds when
    tensor parallelism splits it (``style``: "colwise" by rows, its output features; "rowwise" by columns) over
    "tp", and FSDP2 then splits that part by its first dimension over "dp"; rank = dp index x tp + tp index."""
    d, t = divmod(rank, tp)
    rows, columns = range(out_features), range(in_features)
    if style == "colwise":
        size = out_features // tp
        rows = range(t * size, (t + 1) * size)
    else:
        size = in_features // tp
        columns = range(t * size, (t + 1) * size)
    share = len(rows) // dp  # FSDP2 shards the tensor-parallel part by dim 0, its rows
    return range(rows.start + d * share, rows.start + (d + 1) * share), columns


def draw_mesh_shards(axes: Any = None, ffn: int = 64, hidden: int = 16) -> Any:
    """Draw which part of the MLP's two weights, (ffn, hidden) split by rows and (hidden, ffn) by columns over
    "tp", each rank of a (2, 2) mesh holds once FSDP2 has split that part again by rows over "dp"."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [1, 2]})
    for ax, (name, shape, style) in zip(axes, (("first weight, colwise", (ffn, hidden), "colwise"),
                                               ("last weight, rowwise", (hidden, ffn), "rowwise")), strict=True):
        out_features, in_features = shape
        for rank in range(4):
            rows, columns = mesh_rows_and_columns(out_features, in_features, style, 2, 2, rank)
            ax.add_patch(Rectangle((columns.start, out_features - rows.stop), len(columns), len(rows),
                                   facecolor=MESH_COLOURS[rank], edgecolor="black", linewidth=0.6))
            d, t = divmod(rank, 2)
            ax.text(columns.start + len(columns) / 2, out_features - rows.start - len(rows) / 2,
                    f"rank {rank}\n(dp {d}, tp {t})", ha="center", va="center", fontsize=7.5, color="white")
        ax.set_xlim(0, in_features)
        ax.set_ylim(0, out_features)
        ax.set_aspect("equal")
        ax.set_xticks([0, in_features])
        ax.set_yticks([0, out_features], [str(out_features), "0"])
        ax.set_title(f"{name} {shape}", fontsize=9)
    return axes

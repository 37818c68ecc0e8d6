"""Chapter 12's pictures: a grid of blocks and threads, a Triton program's tiles, coalesced against strided
loads, and the software pipeline's stages. Each function draws on a new figure and returns it."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

_ON, _OFF, _EDGE = "#9ecae1", "#eeeeee", "#555555"


def _box(ax, x, y, w, h, color, text: object = "", size=7, edge=_EDGE):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, linewidth=0.8))
    if text != "":
        ax.text(x + w / 2, y + h / 2, str(text), ha="center", va="center", fontsize=size)


def _frame(ax, width, height):
    ax.set_xlim(-0.5, width + 0.5)
    ax.set_ylim(-0.8, height + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")


def draw_grid(blocks: int = 3, threads: int = 8, n: int = 20):
    """Draw a grid of ``blocks`` blocks of ``threads`` threads over ``n`` elements: each thread's global index
    ``blockIdx.x * blockDim.x + threadIdx.x``; threads past ``n`` greyed (the ``if i < n`` guard)."""
    fig, ax = plt.subplots(figsize=(10, 2.4))
    for b in range(blocks):
        x0 = b * (threads + 1)
        _box(ax, x0 - 0.2, -0.2, threads + 0.4, 2.0, "white")
        ax.text(x0 + threads / 2, 1.95, f"block {b} (blockIdx.x = {b})", ha="center", va="bottom", fontsize=8)
        for t in range(threads):
            i = b * threads + t
            _box(ax, x0 + t, 0.9, 1, 0.7, _ON if i < n else _OFF, t)
            _box(ax, x0 + t, 0.0, 1, 0.7, _ON if i < n else _OFF, i)
    ax.text(-0.4, 1.25, "threadIdx.x", ha="right", va="center", fontsize=7)
    ax.text(-0.4, 0.35, "i", ha="right", va="center", fontsize=7)
    ax.set_title(f"a grid of {blocks} blocks x {threads} threads over n = {n} (grey: i >= n, does nothing)",
                 fontsize=9)
    _frame(ax, blocks * (threads + 1), 2.3)
    return fig


def draw_tiles(n: int = 20, block: int = 8, m: int = 4, grid_n: int = 3, k_tiles: int = 2):
    """Draw a Triton program's tile: top, a vector cut into programs of ``block`` lanes with the mask past ``n``;
    bottom, the output tile (pid_m, pid_n) of a matrix product and the strips of A and B it reads, ``k_tiles``
    tiles long."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), gridspec_kw={"height_ratios": [1, 1.7]})
    programs = -(-n // block)
    for p in range(programs):
        for lane in range(block):
            i = p * block + lane
            _box(top, i + 0.2 * p, 0, 1, 1, _ON if i < n else _OFF, i, size=7)
        top.text(p * block + 0.2 * p + block / 2, 1.2, f"program_id = {p}", ha="center", va="bottom", fontsize=8)
    top.text(0, -0.3, "offsets = pid * BLOCK + tl.arange(0, BLOCK); grey lanes: mask = offsets < n is False",
             va="top", fontsize=8)
    _frame(top, programs * block + programs, 1.6)
    top.set_title(f"one program = one tile of BLOCK = {block} lanes", fontsize=9)
    h = 0.6  # the height of a tile row
    x0, y0 = k_tiles + 0.6, 0.0  # C's lower left corner; A on its left, B above it
    for r in range(m):  # C's tiles, top row first, with the program's tile (1, 2) coloured
        y = y0 + (m - 1 - r) * h
        for c in range(grid_n):
            _box(bottom, x0 + c, y, 1, h, "#fdae6b" if (r, c) == (1, 2) else "white")
        for k in range(k_tiles):  # A's row of tiles: the strip its program reads
            _box(bottom, k, y, 1, h, "#fdae6b" if r == 1 else "white")
    for k in range(k_tiles):  # B's tiles, above C
        y = y0 + m * h + 0.3 + (k_tiles - 1 - k) * h
        for c in range(grid_n):
            _box(bottom, x0 + c, y, 1, h, "#fdae6b" if c == 2 else "white")
    bottom.text(k_tiles / 2, y0 + m * h + 0.1, "A", ha="center", va="bottom", fontsize=9)
    bottom.text(x0 - 0.15, y0 + m * h + 0.3 + k_tiles * h / 2, "B", ha="right", va="center", fontsize=9)
    bottom.text(x0 + grid_n / 2, y0 - 0.1, "C: the program (pid_m=1, pid_n=2) writes the orange tile, "
                "reading A's row of tiles and B's column", ha="center", va="top", fontsize=8)
    bottom.set_xlim(-0.3, x0 + grid_n + 2.6)
    bottom.set_ylim(-0.8, y0 + (m + k_tiles) * h + 0.5)
    bottom.set_aspect("equal")
    bottom.axis("off")
    bottom.set_title("a matmul program: one tile of C, a strip of A and of B", fontsize=9)
    fig.tight_layout()
    return fig


def draw_access(lanes: int = 8, stride: int = 4):
    """Draw ``lanes`` threads of a warp loading 4-byte floats: next to each other (coalesced, one segment) and
    ``stride`` elements apart (strided, the segments touched hold mostly unused bytes)."""
    fig, axes = plt.subplots(2, 1, figsize=(10, 2.8))
    width = lanes * stride
    for ax, step, title in ((axes[0], 1, "coalesced: x[i]"), (axes[1], stride, f"strided: x[{stride} * i]")):
        used = {lane * step for lane in range(lanes)}
        for a in range(width):
            _box(ax, a, 0, 1, 0.8, "#fdae6b" if a in used else _OFF)
        for lane in range(lanes):
            _box(ax, lane * stride + stride / 2 - 0.5, 1.6, 1, 0.6, _ON, f"t{lane}", size=6)
            ax.annotate("", xy=(lane * step + 0.5, 0.85), xytext=(lane * stride + stride / 2, 1.55),
                        arrowprops={"arrowstyle": "->", "lw": 0.6})
        touched = len({a * 4 // 32 for a in used})  # 32-byte sectors the loads touch
        ax.set_title(f"{title}: {lanes} floats used, {touched} of {width * 4 // 32} 32-byte sectors touched",
                     fontsize=9)
        _frame(ax, width, 2.3)
    fig.tight_layout()
    return fig


def draw_pipeline(stages: tuple[int, ...] = (1, 3), steps: int = 6):
    """Draw a matmul's loop with each number of ``stages``: with one buffer, a tile's load waits for the last
    multiply to free it; with more, the loads of the next tiles run while the current one is multiplied, each into
    its own buffer of shared memory (equal times assumed)."""
    fig, axes = plt.subplots(len(stages), 1, figsize=(10, 1.5 * len(stages)), squeeze=False)
    for ax, count in zip(axes[:, 0], stages, strict=True):
        for k in range(steps):
            load_at = 2 * k if count == 1 else k
            _box(ax, load_at, 1.0, 1, 0.6, _ON, f"load {k}\nbuf {k % count}", size=6)
            _box(ax, load_at + 1, 0.2, 1, 0.6, "#fdae6b", f"mma {k}", size=6)
        ax.text(-0.3, 1.3, "loads to shared", ha="right", va="center", fontsize=7)
        ax.text(-0.3, 0.5, "Tensor Cores", ha="right", va="center", fontsize=7)
        end = 2 * steps if count == 1 else steps + 1
        ax.set_title(f"num_stages = {count}: {count} tile buffer{'s' * (count > 1)} in shared memory; "
                     f"{steps} steps end at time {end}", fontsize=9)
        ax.set_xlim(-2.6, 2 * steps + 0.5)
        ax.set_ylim(-0.1, 1.8)
        ax.axis("off")
    fig.tight_layout()
    return fig

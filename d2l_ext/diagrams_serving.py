"""Chapter 13's pictures: the KV cache growing, a block table, the batch's slots over time, draft and verify."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

_NEW, _OLD, _FREE, _DRAFT, _BAD = "#f4a261", "#8ecae6", "#eeeeee", "#b5e48c", "#e76f51"


def _box(ax, x, y, color, text="", w=0.9, h=0.8):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", linewidth=0.6))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=7)


def _frame(ax, title):
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_aspect("equal")
    ax.axis("off")
    ax.autoscale_view()


def draw_cache_growing(steps: int = 5, prompt: int = 3):
    """Each decode step computes the key and value of one new token (orange) and reads the cached ones (blue)."""
    fig, ax = plt.subplots(figsize=(6, 2.4))
    for step in range(steps):
        y = steps - step
        ax.text(-0.3, y + 0.4, "prefill" if step == 0 else f"decode {step}", ha="right", va="center", fontsize=8)
        for position in range(prompt + step):
            new = position >= prompt + step - 1 if step else True
            _box(ax, position, y, _NEW if new else _OLD, f"{position}")
    ax.text(prompt + steps, 2, "orange: computed this step\nblue: read from the cache", fontsize=8, va="center")
    _frame(ax, "The KV cache grows by one position a step")
    return fig


def draw_block_table(block_size: int = 4, lengths=(10, 5, 7)):
    """Requests' positions in fixed-size blocks of one pool; each request's block table lists its blocks."""
    fig, ax = plt.subplots(figsize=(9, 3.2))
    colors = ["#8ecae6", "#f4a261", "#b5e48c"]
    pool, next_free = {}, 0
    width = block_size + 0.6  # a block and the gap after it
    for r, length in enumerate(lengths):
        blocks = -(-length // block_size)
        table = list(range(next_free, next_free + blocks))
        next_free += blocks
        y = 2.2 + (len(lengths) - 1 - r) * 0.9
        _box(ax, 0, y, colors[r], w=0.6, h=0.6)
        ax.text(0.9, y + 0.3, f"request {r}: {length} positions, block table {table}", va="center", fontsize=9)
        for i, b in enumerate(table):
            pool[b] = (r, min(block_size, length - i * block_size))
    for b in range(next_free + 2):
        for slot in range(block_size):
            used = b in pool and slot < pool[b][1]
            _box(ax, b * width + slot, 0, colors[pool[b][0]] if used else _FREE, w=1, h=1)
        ax.text(b * width + block_size / 2, 1.15, f"block {b}", ha="center", fontsize=8)
    ax.text(0, -0.5, "the pool; grey: free, or the unused end of a request's last block", va="top", fontsize=9)
    _frame(ax, f"A paged KV cache: blocks of {block_size} positions, one block table per request")
    ax.set_xlim(-0.3, (next_free + 2) * width)
    ax.set_ylim(-1.2, 2.2 + len(lengths) * 0.9)
    return fig


def draw_slots(requests=((2, 6), (2, 3), (2, 2), (2, 5), (2, 4), (2, 2)), slots: int = 2):
    """Static batching (a batch waits for its longest request) against continuous (a free slot takes the next
    request at once); ``requests`` are (prompt, new tokens) pairs. Orange: a request's first token."""
    fig, axes = plt.subplots(2, 1, figsize=(8, 3.6), sharex=True)
    for ax, continuous in zip(axes, (False, True), strict=True):
        free_at = [0] * slots
        for i, (_, new) in enumerate(requests):
            if continuous:
                slot = min(range(slots), key=lambda s: free_at[s])
                start = free_at[slot]
            else:  # the batch of request i starts when every earlier batch has finished its longest request
                slot = i % slots
                start = sum(max(n for _, n in requests[j:j + slots]) for j in range(0, i - i % slots, slots))
            for t in range(new):
                _box(ax, start + t, slot, _OLD if t else _NEW, f"r{i}" if t == 0 else "", w=1, h=0.9)
            free_at[slot] = start + new
        end = max(free_at)
        for slot in range(slots):
            ax.text(-0.3, slot + 0.45, f"slot {slot}", ha="right", va="center", fontsize=9)
        ax.text(end + 0.3, slots / 2, f"done after {end} iterations", va="center", fontsize=9)
        _frame(ax, "continuous batching" if continuous else "static batching")
        ax.set_xlim(-2, 19)
        ax.set_ylim(-0.2, slots + 0.1)
    axes[1].text(0, -0.2, "decode iterations ->", va="top", fontsize=9)
    fig.tight_layout()
    return fig


def draw_speculation(accepted=(True, True, False, True)):
    """One round: the draft proposes k tokens; the target checks them in one forward, keeps the matching prefix,
    and adds its own token where the first mismatch is."""
    fig, ax = plt.subplots(figsize=(6, 1.8))
    kept = next((i for i, ok in enumerate(accepted) if not ok), len(accepted))
    for i in range(len(accepted)):
        _box(ax, i, 1, _DRAFT, f"d{i + 1}")
        color = _DRAFT if i < kept else (_NEW if i == kept else _FREE)
        _box(ax, i, 0, color, "ok" if i < kept else ("own" if i == kept else ""))
    ax.text(-0.3, 1.4, "draft proposes", ha="right", va="center", fontsize=8)
    ax.text(-0.3, 0.4, "target checks", ha="right", va="center", fontsize=8)
    ax.text(len(accepted) + 0.3, 0.4, f"{kept} accepted + 1 from the target\nin one target forward", fontsize=8,
            va="center")
    _frame(ax, "Speculative decoding: draft, then verify")
    return fig

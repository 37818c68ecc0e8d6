"""Pictures of chapter 6's ideas, computed rather than drawn by hand: a data-parallel step, the ring
all-reduce, and DDP's gradient buckets overlapping the backward pass.

The ring all-reduce picture comes from running the algorithm (``ring_allreduce_steps``) on labels, and the
bucket timeline from a small schedule (``bucket_schedule``): what they show is what the algorithm does, and the
tests check it. The durations in the bucket timeline are chosen for the picture, not measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def ring_allreduce_steps(n: int) -> list[list[list[frozenset[int]]]]:
    """Run the ring all-reduce of ``n`` GPUs, each holding ``n`` chunks, on labels; return every state.

    ``state[g][c]`` is the set of GPUs whose chunk ``c`` has been summed into GPU ``g``'s copy. Reduce-scatter:
    for ``n - 1`` steps each GPU sends one chunk to the next GPU in the ring, which adds it to its own, so that
    GPU ``g`` ends with the complete sum of chunk ``(g + 1) % n``. All-gather: ``n - 1`` more steps pass the
    complete chunks on around the ring. Each GPU sends ``2 (n - 1)`` chunks of size 1/n in all.
    """
    if n < 2:
        raise ValueError("a ring needs at least 2 GPUs")
    state = [[frozenset({g}) for _ in range(n)] for g in range(n)]
    states = [[row[:] for row in state]]
    for step in range(n - 1):  # reduce-scatter
        sent = [(g, (g - step) % n, state[g][(g - step) % n]) for g in range(n)]  # all send at once
        for g, chunk, labels in sent:
            state[(g + 1) % n][chunk] = state[(g + 1) % n][chunk] | labels
        states.append([row[:] for row in state])
    for step in range(n - 1):  # all-gather
        sent = [(g, (g + 1 - step) % n, state[g][(g + 1 - step) % n]) for g in range(n)]
        for g, chunk, labels in sent:
            state[(g + 1) % n][chunk] = labels
        states.append([row[:] for row in state])
    return states


def draw_ring_allreduce(n: int = 3, ax_row: Any = None) -> Any:
    """Draw every state of the ring all-reduce of ``n`` GPUs as a grid (GPUs by chunks); return the Figure."""
    import matplotlib.pyplot as plt  # here, so that the algorithm itself does not need matplotlib
    from matplotlib.patches import Rectangle

    states = ring_allreduce_steps(n)
    if ax_row is None:
        _, ax_row = plt.subplots(1, len(states), figsize=(2.0 * len(states), 1.1 + 0.45 * n))
    titles = ["start"] + [f"reduce-scatter {s + 1}" for s in range(n - 1)] + [f"all-gather {s + 1}" for s in
                                                                              range(n - 1)]
    for ax, state, title in zip(ax_row, states, titles, strict=True):
        for g in range(n):
            for c in range(n):
                labels = state[g][c]
                complete = len(labels) == n
                ax.add_patch(Rectangle((c, n - 1 - g), 0.92, 0.86, edgecolor="black", linewidth=0.6,
                                           facecolor="tab:green" if complete else
                                           plt.get_cmap("Blues")(0.25 + 0.5 * len(labels) / n)))
                ax.text(c + 0.46, n - 1 - g + 0.43, "+".join(map(str, sorted(labels))), ha="center",
                        va="center", fontsize=7)
        ax.set_xlim(-0.1, n)
        ax.set_ylim(-0.1, n)
        ax.set_xticks([c + 0.46 for c in range(n)], [f"chunk {c}" for c in range(n)], fontsize=6)
        ax.set_yticks([n - 1 - g + 0.43 for g in range(n)], [f"GPU {g}" for g in range(n)], fontsize=7)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_title(title, fontsize=8)
    figure = ax_row[0].figure
    figure.suptitle(f"ring all-reduce of {n} GPUs: the numbers say whose gradients a chunk holds "
                    "(green: the complete sum)", fontsize=9)
    figure.tight_layout()
    return figure


@dataclass(frozen=True)
class Interval:
    """A span of the bucket timeline, in ms from the start of the backward pass."""

    lane: str
    name: str
    start: float
    end: float


def bucket_schedule(backward_ms: list[float], buckets: list[int], allreduce_ms: list[float]) -> list[Interval]:
    """Return the backward pass and the all-reduces of a DDP step as intervals.

    ``backward_ms`` are the layers' backward times, last layer first (the order autograd computes them);
    ``buckets`` says how many consecutive layers each bucket holds; ``allreduce_ms`` is each bucket's all-reduce
    time. A bucket's all-reduce starts once its last gradient is computed and the previous all-reduce is done
    (one communication stream), while the backward pass goes on: this is DDP's overlap. One bucket holding every
    layer is the case without overlap.
    """
    if sum(buckets) != len(backward_ms) or len(buckets) != len(allreduce_ms):
        raise ValueError("buckets must cover every layer once, with one all-reduce time per bucket")
    intervals, clock = [], 0.0
    ready = []
    for index, duration in enumerate(backward_ms):
        intervals.append(Interval("backward", f"layer {len(backward_ms) - index}", clock, clock + duration))
        clock += duration
        ready.append(clock)
    free, last_layer = 0.0, -1
    for number, (size, duration) in enumerate(zip(buckets, allreduce_ms, strict=True)):
        last_layer += size
        start = max(ready[last_layer], free)
        intervals.append(Interval("all-reduce", f"bucket {number}", start, start + duration))
        free = start + duration
    return intervals


def draw_ddp_buckets(ax_pair: Any = None) -> Any:
    """Draw one DDP backward pass with three gradient buckets against one all-reduce at the end; return the Figure."""
    import matplotlib.pyplot as plt

    backward = [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]  # six layers, 2 ms each (chosen for the picture)
    cases = {"three buckets: all-reduces overlap the backward pass": bucket_schedule(backward, [2, 2, 2],
                                                                                   [2.5, 2.5, 2.5]),
             "one bucket: the all-reduce waits for the whole backward pass": bucket_schedule(backward, [6],
                                                                                           [7.5])}
    if ax_pair is None:
        _, ax_pair = plt.subplots(2, 1, figsize=(8, 3.2), sharex=True)
    colours = {"backward": "tab:orange", "all-reduce": "tab:purple"}
    for ax, (title, intervals) in zip(ax_pair, cases.items(), strict=True):
        rows = {"backward": 1, "all-reduce": 0}
        for interval in intervals:
            ax.broken_barh([(interval.start, interval.end - interval.start)], (rows[interval.lane] - 0.35, 0.7),
                           facecolors=colours[interval.lane], edgecolor="black", linewidth=0.5)
            ax.text((interval.start + interval.end) / 2, rows[interval.lane], interval.name, ha="center",
                    va="center", fontsize=7, color="white")
        end = max(i.end for i in intervals)
        ax.axvline(end, color="black", linestyle=":", linewidth=1)
        ax.text(end + 0.2, 0.5, f"step done\nat {end:g} ms", fontsize=7, va="center")
        ax.set_yticks([1, 0], ["backward (compute)", "all-reduce (communication)"], fontsize=8)
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(title, fontsize=9)
    ax_pair[-1].set_xlabel("ms from the start of the backward pass (durations chosen for the picture)")
    ax_pair[-1].set_xlim(0, 24)
    figure = ax_pair[0].figure
    figure.tight_layout()
    return figure


def draw_data_parallel_step(ax: Any = None) -> Any:
    """Draw one data-parallel training step on two GPUs, from the split batch to the identical update."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.8))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4)
    ax.axis("off")

    def box(x: float, y: float, text: str, colour: str, width: float = 1.6) -> None:
        ax.add_patch(Rectangle((x - width / 2, y - 0.35), width, 0.7, facecolor=colour, edgecolor="black",
                                   linewidth=0.6))
        ax.text(x, y, text, ha="center", va="center", fontsize=7.5)

    def arrow(x0: float, y0: float, x1: float, y1: float) -> None:
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops={"arrowstyle": "->", "linewidth": 0.8})

    box(0.9, 2.0, "minibatch\n(global batch)", "lightgray", width=1.5)
    ax.add_patch(Rectangle((6.4, 1.55), 1.4, 0.9, facecolor="white", edgecolor="tab:purple", linewidth=1.2,
                               linestyle="--"))
    ax.text(7.1, 2.0, "all-reduce:\nmean of the\ngradients", ha="center", va="center", fontsize=7.5,
            color="tab:purple")
    for gpu, y in ((0, 3.1), (1, 0.9)):
        box(3.0, y, f"half {gpu}\non GPU {gpu}", "lightsteelblue")
        box(5.1, y, f"model copy {gpu}:\nforward, backward", "moccasin", width=1.9)
        box(7.1, y, f"gradient {gpu}", "thistle")
        box(9.1, y, f"same update\non GPU {gpu}", "palegreen", width=1.5)
        arrow(1.65, 2.0, 2.2, y)
        arrow(3.8, y, 4.15, y)
        arrow(6.05, y, 6.3, y)
        toward = 2.45 if y > 2 else 1.55  # each gradient goes into the all-reduce, whose mean goes to every GPU
        arrow(6.9, y - 0.35 if y > 2 else y + 0.35, 6.9, toward)
        arrow(7.8, toward, 8.35, y)
    ax.set_title("one data-parallel step: each GPU holds the whole model and computes on its half of the batch",
                 fontsize=9)
    return ax


# the caching allocator's state in chapter 2's picture: segments reserved from the driver, each cut into blocks
# (name, MiB, live); sizes chosen for the picture
ALLOCATOR_SEGMENTS = [[("x", 6, True), ("", 4, False), ("y", 6, True), ("", 4, False)],
                      [("z", 12, True), ("", 8, False)]]


def allocator_numbers(segments: list[list[tuple[str, int, bool]]], request: int) -> dict[str, int | bool]:
    """Return what the allocator's counters say about ``segments``, and whether ``request`` MiB fits a free block."""
    blocks = [block for segment in segments for block in segment]
    free = [size for _, size, live in blocks if not live]
    return {"allocated": sum(size for _, size, live in blocks if live), "reserved": sum(size for _, size, _ in blocks),
            "cached": sum(free), "largest free block": max(free, default=0), "fits": max(free, default=0) >= request}


def draw_caching_allocator(request: int = 10, ax: Any = None) -> Any:
    """Draw the caching allocator's segments and blocks, and a request that no single free block can hold."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.6))
    numbers = allocator_numbers(ALLOCATOR_SEGMENTS, request)
    for row, segment in enumerate(ALLOCATOR_SEGMENTS):
        y, x = len(ALLOCATOR_SEGMENTS) - row, 0.0
        for name, size, live in segment:
            ax.add_patch(Rectangle((x, y - 0.3), size, 0.6, facecolor="tab:blue" if live else "gainsboro",
                                   edgecolor="black", linewidth=0.8))
            ax.text(x + size / 2, y, f"tensor {name}\n{size} MiB" if live else f"cached\n{size} MiB", ha="center",
                    va="center", fontsize=7, color="white" if live else "black")
            x += size
        ax.text(-0.5, y, f"segment {row + 1}\n({x:g} MiB reserved)", ha="right", va="center", fontsize=7.5)
    ax.add_patch(Rectangle((24, 2.7), request, 0.6, facecolor="tab:red", alpha=0.5, edgecolor="black"))
    ax.text(24 + request / 2, 3.0, f"new tensor: {request} MiB", ha="center", va="center", fontsize=7.5)
    ax.text(24, 2.35, f"{numbers['cached']} MiB are cached, but the largest free block holds\n"
            f"{numbers['largest free block']} MiB: the allocator asks the driver for a new segment\n"
            "(or raises out of memory if the GPU is full): fragmentation", fontsize=7, va="top")
    ax.set_xlim(-9, 40)
    ax.set_ylim(0.4, 3.5)
    ax.axis("off")
    ax.legend(handles=[Patch(facecolor="tab:blue", edgecolor="black",
                             label=f"allocated (live tensors): {numbers['allocated']} MiB"),
                       Patch(facecolor="gainsboro", edgecolor="black",
                             label=f"cached, free: {numbers['cached']} MiB")],
              loc="lower left", bbox_to_anchor=(0.0, -0.05), fontsize=7, frameon=False, ncols=2)
    ax.set_title(f"the caching allocator (a schematic): memory_allocated {numbers['allocated']} MiB, "
                 f"memory_reserved {numbers['reserved']} MiB", fontsize=9)
    return ax


def draw_host_and_devices(ax: Any = None) -> Any:
    """Draw chapter 1's picture: the host and two GPUs, each a device with its own memory, and what one process
    sees of them (with CUDA_VISIBLE_DEVICES=1, physical GPU 1 is the process's cuda:0)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.9))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.45, 4.3)
    ax.axis("off")

    def box(x: float, y: float, w: float, h: float, colour: str, text: str = "", size: float = 7.5) -> None:
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", facecolor=colour, edgecolor="black",
                                    linewidth=0.7))
        if text:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    box(0.2, 0.5, 3.4, 3.5, "whitesmoke")
    ax.text(1.9, 3.75, "host: torch.device('cpu')", ha="center", fontsize=8.5, weight="bold")
    box(0.45, 2.35, 1.35, 1.05, "lightsteelblue", "CPU\n(a few fast\ncores)")
    box(2.0, 2.35, 1.35, 1.05, "wheat", "host memory\n(RAM)")
    box(0.45, 0.75, 2.9, 1.2, "white", "your Python process:\nruns the program, launches\nwork on the devices")
    for index, y in enumerate((2.45, 0.25)):
        box(6.0, y, 3.7, 1.75, "honeydew")
        ax.text(7.85, y + 1.48, f"GPU {index} (physical)", ha="center", fontsize=8.5, weight="bold")
        box(6.2, y + 0.2, 1.6, 1.0, "palegreen", "streaming\nmultiprocessors\n(thousands of\nsimple cores)", 6.5)
        box(7.95, y + 0.2, 1.55, 1.0, "wheat", "GPU memory\n(its own)", 7)
        ax.annotate("", xy=(6.0, y + 0.9), xytext=(3.6, 2.2), arrowprops={"arrowstyle": "<->", "linewidth": 1})
    ax.text(4.8, 2.95, "PCIe (or NVLink-C2C):\ncopies between host\nand GPU memory", ha="center", fontsize=7)
    ax.annotate("", xy=(9.85, 2.45), xytext=(9.85, 2.0), arrowprops={"arrowstyle": "<->", "linewidth": 1})
    ax.text(9.9, 2.22, " NVLink or\n PCIe peer", fontsize=6.5, va="center")
    ax.text(1.9, 0.4, "the process sees cuda:0 = GPU 0, cuda:1 = GPU 1;\n"
            "with CUDA_VISIBLE_DEVICES=1 only GPU 1, as cuda:0", ha="center", va="top", fontsize=7.5,
            color="tab:blue")
    ax.set_title("devices: processors with their own memory, on which PyTorch keeps tensors and runs operations",
                 fontsize=9)
    return ax


def draw_copy_paths(ax: Any = None) -> Any:
    """Draw chapter 3's map: where a tensor's bytes can live and the paths a copy takes between them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4.2))
    ax.set_xlim(0, 11.2)
    ax.set_ylim(-0.3, 5.5)
    ax.axis("off")

    def box(x: float, y: float, w: float, h: float, text: str, color: str, size: float = 8, bold: bool = False,
            outline: float = 1.0) -> None:
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", facecolor=color,
                                    edgecolor="black", linewidth=outline))
        if bold:
            ax.text(x + w / 2, y + h - 0.3, text, ha="center", fontsize=size, weight="bold")
        else:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(start: tuple[float, float], end: tuple[float, float], dashed: bool = False) -> None:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>", mutation_scale=10, linewidth=1.2,
                                     linestyle="--" if dashed else "-", color="black"))

    box(0.1, 0.2, 3.4, 5.1, "host: CPU and its memory (RAM)", "#f2f2f2", bold=True)
    box(0.3, 3.8, 2.95, 0.85, "CPU cores\n(run Python, queue GPU work)", "#ffe8cc")
    box(0.3, 2.2, 2.95, 0.95, "pageable memory\n(every ordinary tensor)", "#dbe9f6")
    box(0.3, 0.45, 2.95, 0.95, "pinned (page-locked) memory\n.pin_memory(), pin_memory=True", "#cfe8cf")
    ax.add_patch(FancyArrowPatch((1.2, 2.2), (1.2, 1.4), arrowstyle="-|>", mutation_scale=10, linewidth=1.2))
    ax.text(1.3, 1.8, "the CPU copies into a pinned\nstaging buffer (pageable copies)", va="center",
            fontsize=6.2)
    for y, name in [(3.05, "GPU 0 (cuda:0)"), (0.2, "GPU 1 (cuda:1)")]:
        box(6.5, y, 3.0, 2.25, name, "#f7ecf7", bold=True)
        box(6.7, y + 0.55, 1.15, 0.9, "copy\nengine\n(DMA)", "#fff2b3", size=7)
        box(8.05, y + 0.2, 1.25, 1.5, "GPU memory\n(its tensors)", "#e6d5f0", size=7)
    arrow((3.3, 1.3), (6.7, 4.15))
    ax.text(4.75, 4.2, "host <-> GPU:\nPCIe (or NVLink-C2C),\nmoved by the copy engine,\nno CPU work",
            ha="center", fontsize=7, rotation=0)
    arrow((8.7, 3.25), (8.7, 2.25))
    ax.text(9.75, 2.75, "GPU <-> GPU:\npeer to peer\n(NVLink or PCIe)\nif can_device_\naccess_peer", va="center",
            fontsize=7)
    arrow((6.7, 3.75), (3.3, 0.95), dashed=True)
    arrow((3.3, 0.7), (6.7, 1.0), dashed=True)
    ax.text(5.0, 0.42, "no peer access: GPU to GPU\ngoes through host memory (dashed)", ha="center",
            fontsize=6.5, style="italic")
    ax.text(5.6, -0.2, "Apple silicon and integrated GPUs have no such link: one memory serves the CPU and the GPU.",
            ha="center", fontsize=7, style="italic")
    return ax


RANK_COLOURS = ("#4C72B0", "#DD8452")  # rank 0, rank 1, in chapter 9's pictures


def draw_model_splits(axes: Any = None) -> Any:
    """Draw chapter 9's three ways of splitting one model over two ranks (colours: rank 0, rank 1): a layer's
    weights (tensor parallelism), the tokens of a sequence (sequence parallelism), the layers (pipeline)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(10, 2.8))
    for ax in axes:
        ax.set_xlim(0, 10)
        ax.set_ylim(0, 10)
        ax.axis("off")

    def block(ax: Any, x: float, y: float, w: float, h: float, rank: int | None, text: str = "") -> None:
        colour = "lightgray" if rank is None else RANK_COLOURS[rank]
        ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="black", linewidth=0.6,
                               alpha=0.85 if rank is not None else 1))
        if text:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=7.5,
                    color="white" if rank is not None else "black")

    tensor, sequence, pipeline = axes
    # tensor: X (every rank) times A split by columns, then B split by rows; the partial outputs are summed
    block(tensor, 0.2, 3.5, 1.6, 3, None, "X\n(all)")
    block(tensor, 2.3, 3.0, 1.2, 4, 0, "A₀")
    block(tensor, 3.5, 3.0, 1.2, 4, 1, "A₁")
    block(tensor, 5.3, 5.0, 2.4, 2, 0, "B₀")
    block(tensor, 5.3, 3.0, 2.4, 2, 1, "B₁")
    block(tensor, 8.2, 3.5, 1.6, 3, None, "Y₀+Y₁\nall-reduce")
    tensor.set_title("tensor: A by columns, B by rows", fontsize=9)
    # sequence: each rank normalizes its own tokens; all-gather before the split layers, reduce-scatter after
    for token in range(8):
        block(sequence, 0.3 + token * 1.15, 6.5, 1.0, 1.4, token // 4, f"t{token}")
    sequence.text(5, 5.4, "LayerNorm, dropout: each rank its tokens", ha="center", fontsize=7.5)
    sequence.text(5, 4.2, "all-gather ↓   tensor-parallel MLP   ↓ reduce-scatter", ha="center", fontsize=7.5)
    for token in range(8):
        block(sequence, 0.3 + token * 1.15, 1.6, 1.0, 1.4, token // 4, f"t{token}")
    sequence.set_title("sequence: the tokens outside the split layers", fontsize=9)
    # pipeline: the layers in order, the first half on rank 0; activations go forward, gradients back
    for layer in range(4):
        block(pipeline, 1.0, 7.6 - layer * 2.2, 4.0, 1.6, layer // 2, f"layer {layer}")
    pipeline.annotate("", xy=(6.0, 1.2), xytext=(6.0, 9.0), arrowprops={"arrowstyle": "->", "linewidth": 0.8})
    pipeline.text(6.3, 5.0, "activations\nforward,\ngradients\nback", va="center", fontsize=7.5)
    pipeline.set_title("pipeline: the layers, in stages", fontsize=9)
    return axes


def draw_gpu(ax: Any = None) -> Any:
    """Draw chapter 10's picture of a GPU, an H100 SXM's figures from its spec sheet (d2l_ext.roofline.GPUS and
    NVIDIA's H100 whitepaper): the host link, HBM, the L2 cache, the streaming multiprocessors (SMs), and inside
    one SM its registers, shared memory, CUDA cores, Tensor Cores and the warps it runs; return the Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 5.2))
    ax.set_xlim(0, 20)
    ax.set_ylim(0, 10.4)
    ax.axis("off")

    def box(x: float, y: float, w: float, h: float, colour: str, text: str = "", size: float = 8) -> None:
        ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="black", linewidth=0.6))
        if text:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(start: tuple[float, float], end: tuple[float, float], text: str) -> None:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<->", mutation_scale=10, linewidth=1))
        ax.text((start[0] + end[0]) / 2 + 0.15, (start[1] + end[1]) / 2, text, fontsize=7.5, va="center")

    box(0.2, 7.4, 3.2, 2.2, "whitesmoke", "host\nCPU and its RAM")
    arrow((1.8, 7.4), (1.8, 5.4), "PCIe Gen5:\n64 GB/s\neach way")
    box(0.2, 0.4, 3.2, 5.0, "khaki", "HBM3\n80 GB\n\nevery tensor\non the GPU\nlives here")
    arrow((3.4, 2.9), (4.6, 2.9), "")
    ax.text(3.5, 3.5, "3.35 TB/s", fontsize=7.5)
    box(4.6, 0.4, 1.4, 9.2, "lightsalmon", "L2 cache\n50 MB\n\nshared\nby all\nSMs")
    # the SMs: a grid of small boxes, all alike
    for row in range(6):
        for column in range(6):
            box(6.4 + column * 0.62, 0.6 + row * 1.5, 0.5, 1.2, "lightsteelblue")
    ax.text(8.2, 9.75, "132 SMs (streaming multiprocessors)", ha="center", fontsize=8)
    # one SM, enlarged
    ax.add_patch(Rectangle((10.4, 0.4), 9.4, 9.2, facecolor="aliceblue", edgecolor="steelblue", linewidth=1.2))
    ax.plot([10.1, 10.4], [8.7, 9.6], color="steelblue", linewidth=0.8)
    ax.plot([10.1, 10.4], [7.8, 0.4], color="steelblue", linewidth=0.8)
    ax.text(15.1, 9.2, "one SM", ha="center", fontsize=9, weight="bold")
    box(10.8, 7.2, 8.6, 1.5, "lavender", "registers: 256 KB\neach thread's own variables, the fastest memory")
    box(10.8, 5.4, 8.6, 1.5, "lightsalmon", "shared memory and L1: up to 228 KB\nshared by the threads of a block")
    for quarter in range(4):
        x = 10.8 + quarter * 2.18
        box(x, 2.1, 2.0, 3.0, "white")
        box(x + 0.1, 3.4, 1.8, 1.5, "lightgreen", "32 FP32\nCUDA cores", 7)
        box(x + 0.1, 2.2, 1.8, 1.0, "gold", "Tensor\nCore", 7)
    box(10.8, 0.6, 8.6, 1.3, "white", "warps: groups of 32 threads that run the same instruction; an SM keeps\n"
        "up to 64 warps in flight and switches between them to hide memory's latency", 6.4)
    ax.text(10.0, 0.0, "H100 SXM, from NVIDIA's spec sheet and whitepaper. The further from the cores, the larger "
            "and slower the memory.", ha="center", fontsize=7.5, style="italic")
    return ax


@dataclass
class Attempt:
    """One attempt of chapter 11's training run (scripts/survive.py), as its rank 0 printed it."""

    number: int
    world_size: int = 0
    resumed_from: int | None = None  # the checkpoint's step, if it started from one
    steps: list[int] = field(default_factory=list)  # the steps it finished
    checkpoints: list[int] = field(default_factory=list)  # the steps it saved
    killed: str | None = None  # "rank 1 at step 7", "node 1 at step 7", if the dying worker's line came through


def read_attempts(output: str) -> list[Attempt]:
    """Return, attempt by attempt, what a run of scripts/survive.py printed: its world size, the checkpoint it
    resumed from, the steps it finished and saved, and what was killed in it."""
    import re

    attempts: dict[int, Attempt] = {}

    def attempt(number: str) -> Attempt:
        return attempts.setdefault(int(number), Attempt(int(number)))

    for line in output.splitlines():
        if found := re.match(r"attempt (\d+), worker RANK=\d+ .*\bWORLD_SIZE=(\d+)", line):
            attempt(found[1]).world_size = int(found[2])
        elif found := re.match(r"attempt (\d+): resumed from step_(\d+)", line):
            attempt(found[1]).resumed_from = int(found[2])
        elif found := re.match(r"attempt (\d+): step (\d+) done", line):
            attempt(found[1]).steps.append(int(found[2]))
        elif found := re.match(r"attempt (\d+): checkpoint step_(\d+)", line):
            attempt(found[1]).checkpoints.append(int(found[2]))
        elif found := re.match(r"attempt (\d+): (rank \d+) killed at step (\d+)", line):
            attempt(found[1]).killed = f"{found[2]} at step {found[3]}"
        elif found := re.match(r"attempt (\d+): (node \d+) dies at step (\d+)", line):
            attempt(found[1]).killed = f"{found[2]} at step {found[3]}"
    return [attempts[number] for number in sorted(attempts)]


def draw_restart_timeline(attempts: list[Attempt], failures: list[str] | None = None, ax: Any = None) -> Any:
    """Draw a run's attempts, one row each, over its steps: the steps each finished (redone ones hatched), its
    checkpoints (triangles), where each attempt but the last failed (a cross, labelled with ``failures[i]`` for
    attempt i, e.g. the fault the run was told to inject) and where the next attempt resumed (an arrow)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * len(attempts)))
    done_before: set[int] = set()
    for row, attempt in enumerate(attempts):
        y = len(attempts) - 1 - row
        for step in attempt.steps:
            redone = step in done_before
            ax.barh(y, 0.9, left=step + 0.05, height=0.5, color=RANK_COLOURS[0], alpha=0.45 if redone else 0.9,
                    hatch="///" if redone else None, edgecolor="black", linewidth=0.4)
        for step in attempt.checkpoints:
            ax.plot(step, y + 0.38, marker="v", color="black", markersize=7)
        if row < len(attempts) - 1:  # it ended in a failure: at the step after the last one it finished
            step = max(attempt.steps, default=-1) + 1
            ax.plot(step + 0.5, y, marker="X", color="crimson", markersize=12)
            label = failures[row] if failures and row < len(failures) else "a worker failed here"
            ax.text(step + 1.0, y, label, va="center", fontsize=8, color="crimson")
        if attempt.resumed_from is not None:
            ax.annotate("", xy=(attempt.resumed_from, y), xytext=(attempt.resumed_from, y + 0.75),
                        arrowprops={"arrowstyle": "->", "color": "black"})
        done_before |= set(attempt.steps)
    ax.set_yticks(range(len(attempts)),
                  [f"attempt {a.number}\n(world size {a.world_size})" for a in reversed(attempts)], fontsize=8)
    last = max((s for a in attempts for s in a.steps), default=0)
    ax.set_xticks(range(0, last + 2))
    ax.set_xlim(-0.2, last + 1.4)
    ax.set_ylim(-0.6, len(attempts) - 0.2)
    ax.set_xlabel("step (triangle: a checkpoint saved after the step before it; hatched: a step done again)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax

"""Write notebooks/10_how_fast.ipynb and its solutions from the cells below (a one-off builder, not a tool)."""

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
NAME = "10_how_fast.ipynb"


def md(cell_id, text):
    cell = nbformat.v4.new_markdown_cell(text.strip("\n"))
    cell.id = cell_id
    return cell


def code(cell_id, text, tags=()):
    cell = nbformat.v4.new_code_cell(text.strip("\n"))
    cell.id = cell_id
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


CHAPTER = [
    md("md-intro", r"""
# 10. How fast can it go? FLOPs, rooflines and what communication costs

The course has timed many things. But is a step of 5 ms slow or good? To know, we need the
fastest possible time. Two numbers of the hardware decide it
([glossary](glossary.md#performance)):

* **peak compute**: floating-point operations per second (**FLOP/s**) the cores can do;
* **memory bandwidth**: bytes per second the memory can deliver to the cores.

An operation that does $F$ operations on $B$ bytes takes at least
$\max(F/\text{peak},\ B/\text{bandwidth})$. This chapter counts $F$ and $B$ for the course's operations,
measures this machine's two numbers, and adds a third cost: moving data between devices.

| Section | CPU only | One GPU | Several GPUs |
|---|---|---|---|
| 10.1, 10.2 GPU parts, counted FLOPs | runs | runs | runs |
| 10.3, 10.4 roofline, utilization | this CPU's | this CPU's; 10.7 the GPU's | the same |
| 10.5 communication | 2 CPU processes over gloo | the same | 2 GPUs over NCCL |
| 10.6 worked problems | runs (exact) | runs | runs |
"""),
    code("imports", r"""
import re

import matplotlib.pyplot as plt
import torch
from matplotlib_inline import backend_inline
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import d2l_ext
from d2l_ext import commcost, diagrams, roofline

backend_inline.set_matplotlib_formats("png")
torch.manual_seed(0)
device = d2l_ext.try_gpu()
print("device:", device.type)
""", tags=["device-dependent"]),
    md("md-10-1", r"""
## 10.1 Inside a GPU

A GPU is many small processors, **streaming multiprocessors** (SMs), around one large memory. The
picture shows an H100's parts, with the figures of its spec sheet:

* **HBM**, the GPU memory of chapter 2: every tensor on the GPU lives there, 80 GB at 3.35 TB/s;
* the **L2 cache** (50 MB), which all SMs share;
* in each SM: **registers** and **shared memory**, small and very fast; CUDA cores for ordinary
  arithmetic, and **Tensor Cores**, which multiply small matrices in one step;
* **warps**: an SM runs threads in groups of 32. While one warp waits for memory, another computes.

Data must travel from HBM to the cores before it is used. When the cores compute faster than HBM can
feed them, they wait.
"""),
    code("gpu-picture", r"""
diagrams.draw_gpu()
plt.show()
"""),
    md("md-gpu-table", r"""
The table below holds four GPUs' spec sheets: peak FLOP/s for each dtype and the memory bandwidth.
Their ratio is the **ridge point**: how many FLOPs an operation must do per byte it moves to keep the
cores busy. An operation's own ratio, FLOPs per byte, is its **arithmetic intensity**.
Below the ridge an operation is **memory-bound**; above it, **compute-bound**.
"""),
    code("gpu-table", r"""
dtypes = ["float32", "tf32", "float16", "bfloat16"]
print(f"{'GPU':7} " + " ".join(f"{d:>9}" for d in dtypes)
      + "   memory    ridge (16-bit)")
for name, spec in roofline.GPUS.items():
    peaks = " ".join(f"{spec.peak[d] / 1e12:9.1f}" if d in spec.peak else f"{'-':>9}"
                     for d in dtypes)
    ridge = roofline.ridge_point(name, "float16")
    print(f"{name:7} {peaks}  {spec.bandwidth / 1e12:5.2f} TB/s  {ridge:5.0f} FLOP/B")
print("peaks in TFLOP/s, dense (spec sheets' 'with sparsity' figures are twice these)")
""", tags=["exact"]),
    md("md-gpu-sources", r"""
Sources: NVIDIA's T4, A100 (SXM, 80 GB) and H100 (SXM5) datasheets, and AMD's MI300X data sheet
(`roofline.GPUS[name].source` quotes each). An H100 must do about 295 FLOPs in 16-bit for every byte it
reads, or its Tensor Cores wait. What can a PyTorch user change?

* **the dtype**: 16-bit halves the bytes and uses Tensor Cores (chapter 5b); float32 matrix products use
  them only with TF32 allowed;
* **shapes**: Tensor Cores work on tiles, so sizes that are multiples of 8 or 16 use them fully;
* **the batch**: a larger batch reuses each weight for more rows, so the intensity grows (10.6);
* **fusion**: `torch.compile` merges element-wise operations, so data crosses HBM fewer times.
"""),
    md("md-10-2", r"""
## 10.2 Counting FLOPs

A multiply-add counts as 2 FLOPs. A linear layer on a batch of $b$ rows, from $n$ inputs to $m$ outputs,
does $2bnm$ FLOPs forward. Backward computes two gradients, each as costly: the weight's, and the input's.
`FlopCounterMode` counts the FLOPs of matrix products and convolutions as they run. Count one training
step of an MLP and compare with `roofline.mlp_step_flops`, which writes the formulas out:
"""),
    code("count-mlp", r"""
def counted(step):
    # (forward, backward) FLOPs FlopCounterMode counts for step(), which returns a loss
    with FlopCounterMode(display=False) as forward:
        loss = step()
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return forward.get_total_flops(), backward.get_total_flops()


sizes, batch = [1024, 4096, 1024], 256
with torch.device("meta"):  # shapes, no data: counting needs no memory, no arithmetic
    mlp = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
    x = torch.randn(batch, 1024)
print("counted:", counted(lambda: mlp(x).sum()))
formula = roofline.mlp_step_flops(batch, sizes)
print("formula:", (formula["forward"], formula["backward"]))
weights = sum(a * b for a, b in zip(sizes, sizes[1:], strict=False))
print(f"6 x P x batch = {6 * weights * batch:,}; counted total = {formula['total']:,}")
""", tags=["exact"]),
    md("md-six-p", r"""
The counts agree exactly. The rule of thumb "6 × parameters × tokens" (2 forward, 4 backward) says 12.9
GFLOP, but the step does 10.7: the first layer's input is the data, which needs no gradient, so its input
gradient, $2 \times 256 \times 1024 \times 4096$ FLOPs, is never computed. For a deep model the difference
is small; for this one it is 17%.
"""),
    code("count-conv-block", r"""
conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
image = torch.randn(2, 3, 10, 12)
print("conv:", counted(lambda: conv(image).sum()),
      tuple(roofline.conv2d_flops(2, 3, 8, 3, 10, 12, input_grad=False).values())[:2])


class Block(nn.Module):
    # a pre-LayerNorm transformer block; attention written out (see the text)
    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.out = (nn.Linear(hidden, hidden) for _ in range(4))
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x):
        b, s, h = x.shape
        y = self.norm1(x)
        q, k, v = (f(y).view(b, s, self.heads, -1).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) / (h // self.heads) ** 0.5
        weights = torch.softmax(scores, dim=-1)
        x = x + self.out((weights @ v).transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(self.norm2(x))


tokens = torch.randn(2, 10, 32)
print("block:", counted(lambda: Block()(tokens).sum()),
      tuple(roofline.transformer_block_flops(2, 10, 32).values())[:2])
""", tags=["exact"]),
    md("md-count-read", r"""
Both agree exactly too. A transformer block does $24bsh^2$ FLOPs in its six matrix products and
$4bs^2h$ in attention ($b$ sequences of $s$ tokens, hidden size $h$); backward does twice the forward.
Attention is written out here: on the CPU, `FlopCounterMode` has no formula for the kernel of
`F.scaled_dot_product_attention` and counts 0 for it (torch 2.14; measured here). A counter counts only
what it knows.
"""),
    md("md-10-3", r"""
## 10.3 This machine's roofline

`roofline.measure_machine` times a 1024 × 1024 matrix product (the peak) and an add of two 16 MiB
tensors (the bandwidth) in one call. Their ratio is this machine's ridge. Timings vary from run to run, so
this cell's numbers are not compared:
"""),
    code("machine", r"""
peak, bandwidth = roofline.measure_machine("cpu")
ridge = peak / bandwidth
threads = torch.get_num_threads()
print(f"peak {peak / 1e9:.1f} GFLOP/s, bandwidth {bandwidth / 1e9:.1f} GB/s, "
      f"ridge {ridge:.1f} FLOP/B  ({threads} thread{'s' if threads > 1 else ''})")
""", tags=["nbval-ignore-output"]),
    md("md-ridges", r"""
How far does the ridge move? `tools/measure_ridges.py` measured it on this course's test machine (2 cores
of an AMD EPYC) under each setting CI runs the notebooks with: one or four threads, MKL's slower
compatible code path, ATen without vector kernels, and one core busy. It moved from 1.5 to 6.3 FLOP/B:
"""),
    code("ridges", r"""
for setting, value in roofline.CPU_RIDGES.items():
    print(f"{value:4.1f} FLOP/B  {setting}")
""", tags=["exact"]),
    md("md-intensities", r"""
Now each operation of the course gets its FLOPs, its bytes (read once, written once: the least it must
move) and its arithmetic intensity. These are exact. `roofline.side_of_every` says on which side of all
the ridges above an operation lies; between the lowest and the highest it would say "either side":
"""),
    code("intensities", r"""
operations = roofline.course_operations("cpu")
ridges = roofline.CPU_RIDGES.values()
print(f"{'operation':24} {'FLOPs':>14} {'bytes':>12} {'FLOP/B':>7}  side")
for op in operations:
    side = roofline.side_of_every(op.intensity, ridges)
    print(f"{op.name:24} {op.flops:>14,} {op.nbytes:>12,} {op.intensity:>7.2f}  {side}")
""", tags=["exact"]),
    md("md-roofline-read", r"""
Element-wise and row-wise operations do about one FLOP per byte or less: below every ridge, so memory sets
their pace. A product of two $n \times n$ matrices does $n/6$ FLOPs per byte in float32: at $n = 64$ that is
10.7, above every ridge measured here, though not by much. A CPU with more cores has a higher ridge (more
compute for the same memory), and there a 64 × 64 product is memory-bound.

Now time each operation and place it on the roofline. The line is the best any operation of that intensity
can do: `roofline.attainable`.
"""),
    code("roofline-plot", r"""
achieved = {op.name: op.flops / d2l_ext.measure(op.run, min_run_time=0.05).median
            for op in operations}
# the roof is the best this machine was seen to do: load only ever makes a timing slower
sides = {op.name: roofline.side_of_every(op.intensity, ridges) for op in operations}
peak = max(peak, *(achieved[op.name] for op in operations
                   if sides[op.name] == "compute-bound"))
bandwidth = max(bandwidth, *(achieved[op.name] / op.intensity for op in operations
                             if sides[op.name] == "memory-bound"))
fig, ax = plt.subplots(figsize=(6.4, 3.6))
grid = torch.logspace(-2, 3, 100).tolist()
ax.loglog(grid, [roofline.attainable(i, peak, bandwidth) / 1e9 for i in grid], "k-")
for op in operations:
    ax.plot(op.intensity, achieved[op.name] / 1e9, "o", label=op.name)
ax.axvline(peak / bandwidth, linestyle=":", color="gray")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
ax.set_xlabel("arithmetic intensity (FLOP per byte)")
ax.set_ylabel("GFLOP/s")
ax.set_title("this CPU's roofline (measured; varies from run to run)", fontsize=9)
plt.show()
print(f"roof: peak {peak / 1e9:.1f} GFLOP/s, bandwidth {bandwidth / 1e9:.1f} GB/s")
for op in operations:
    share = achieved[op.name] / roofline.attainable(op.intensity, peak, bandwidth)
    rate = achieved[op.name] / 1e9
    print(f"{op.name:24} {rate:7.2f} GFLOP/s, {share:4.0%} of its roof")
del operations  # their tensors: memory for the two processes 10.5 starts
""", tags=["nbval-ignore-output"]),
    md("md-plot-read", r"""
The roof is the best this machine was seen to do in either cell, since a busy moment can only make a timing
slower, so every point lies on it or under it. The matrix products and the convolution come close to the
peak. The add comes close to the sloped part: it is as fast as memory allows, and a faster ALU would not
help it. Softmax and LayerNorm stay further below: they pass over each row more than once, so they move more bytes than the
least we counted.

On a GPU the same picture has its ridge at 150 to 300 FLOP/B: there a 512 matrix product in 16-bit
($n/3$ = 171 FLOP/B) is still memory-bound on an H100. The course's small models are far below every ridge,
and most of their time is launch overhead (chapter 4): the GPU waits.
"""),
    md("md-10-4", r"""
## 10.4 Utilization

**Model FLOPs utilization** (MFU) is the FLOPs a step needs, divided by what the peak could do in the
step's time. With **activation checkpointing** (chapter 8), backward recomputes part of the forward: those
FLOPs are done but not needed. Counted with them, the ratio is the **hardware FLOPs utilization** (HFU).
Count both for chapter 5's MLP and for a larger block:
"""),
    code("mfu-count", r"""
from torch.utils.checkpoint import checkpoint


def step_flops(model, data, recompute=False):
    def loss():
        if recompute:
            return checkpoint(model, data, use_reentrant=False).sum()
        return model(data).sum()

    return sum(counted(loss)), loss


models = {"chapter 5's MLP": (d2l_ext.make_net(), torch.randn(128, 32)),
          "block, h=256, 128 tokens": (Block(256, 8), torch.randn(8, 128, 256))}
runs = {}
for name, (model, data) in models.items():
    (model_flops, loss), (hardware_flops, loss_ckpt) = (
        step_flops(model, data), step_flops(model, data, recompute=True))
    runs[name] = (model, model_flops, hardware_flops, loss, loss_ckpt)
    print(f"{name}: {model_flops:,} model FLOPs, {hardware_flops:,} with recomputation")
""", tags=["exact"]),
    code("mfu-measure", r"""
steps = {}  # each model's measured step, for 10.5
for name, (_, model_flops, hardware_flops, loss, loss_ckpt) in runs.items():
    timed = d2l_ext.measure(lambda f=loss: f().backward(), min_run_time=0.1)
    plain = steps[name] = timed.median
    again = d2l_ext.measure(lambda f=loss_ckpt: f().backward(), min_run_time=0.1).median
    print(f"{name}: step {plain * 1e3:.2f} ms, MFU {model_flops / plain / peak:.0%}; "
          f"checkpointed {again * 1e3:.2f} ms, MFU {model_flops / again / peak:.0%}, "
          f"HFU {hardware_flops / again / peak:.0%}")
""", tags=["nbval-ignore-output"]),
    md("md-mfu-read", r"""
Checkpointing recomputes the forward pass once, so HFU counts about a third more FLOPs than MFU in the same
time. MFU is the number to compare runs by: it only rises when a step gets faster.

**What to expect on a GPU.** Chapter 5's MLP does about 57 MFLOP per step. A T4 could do that in about
7 µs in float32 (8.1 TFLOP/s), but each of the step's roughly 20 kernels costs several µs to launch
(chapter 4): its MFU would be a few percent at best. The block does about 90 times more per step; large
language models reach 30 to 50% on H100s (10.7). The bigger each matrix product, the higher the MFU.
"""),
    md("md-10-5", r"""
## 10.5 What communication costs

A ring collective on $n$ devices moves data in steps; in each, every device sends one chunk to the next.
A step costs a latency $\alpha$ and its bytes at the link's bandwidth $\beta$:
$t = \text{steps} \cdot \alpha + \text{bytes sent} / \beta$.

| collective | steps | bytes each device sends |
|---|---|---|
| all-reduce | $2(n-1)$ | $2(n-1)/n \cdot S$ |
| all-gather, reduce-scatter, all-to-all | $n-1$ | $(n-1)/n \cdot S$ |

`scripts/collectives.py` times the four on 2 processes, from 1 KiB to 4 MiB here (64 MiB by default; with
this kernel beside them, two processes would then need more than Binder's 2 GB). It also runs a ring
all-reduce written with `isend` and `irecv` (`commcost.ring_all_reduce`, chapter 9's) against
`dist.all_reduce`.
"""),
    code("comm-run", r"""
# about 8 s; one line per collective and size (medians of 5 runs), up to 4 MiB
comm_output = d2l_ext.torchrun("scripts/collectives.py", nproc=2, timeout=300,
                               args=["--largest-mib", "4"], echo=False)
lines = comm_output.splitlines()
print("\n".join(lines[:3] + ["..."] + lines[-3:]))
""", tags=["nbval-ignore-output"]),
    code("comm-ring", r"""
ring = re.search(r"equal to dist.all_reduce on every rank: (\w+)", comm_output)
pattern = r"bytes each rank sent: (\[.*?\]) \(2\(n - 1\)/n x (\d+) = (\d+)\)"
sent = re.search(pattern, comm_output)
assert ring and sent, "the script printed no ring result: did it run?"
print("ring all-reduce equals dist.all_reduce:", ring[1])
print(f"bytes each rank sent: {sent[1]}; 2(n - 1)/n of {sent[2]} bytes = {sent[3]}")
"""),
    code("comm-fit", r"""
times = {}
for name, size, seconds in re.findall(r"time (\w+) (\d+) ([\d.]+)", comm_output):
    times.setdefault(name, []).append((int(size), float(seconds)))
fits = {}
for name, points in times.items():
    sizes_, seconds_ = zip(*points, strict=True)
    fits[name] = alpha, beta = commcost.fit_alpha_beta(name, 2, sizes_, seconds_)
    algbw, busbw = commcost.algbw_busbw(name, 2, sizes_[-1], seconds_[-1])
    print(f"{name:15} alpha {alpha * 1e6:7.1f} us, beta {beta / 1e9:5.2f} GB/s; "
          f"at {sizes_[-1] >> 20} MiB algbw {algbw / 1e9:5.2f}, "
          f"busbw {busbw / 1e9:5.2f} GB/s")
""", tags=["nbval-ignore-output"]),
    code("comm-shape", r"""
# what holds whatever the timings: the fit's latency and bandwidth are never
# negative, so the model's time grows with the size
for name, (alpha, beta) in fits.items():
    model = [commcost.collective_seconds(name, 2, s, alpha, beta)
             for s in (1e3, 1e6, 1e8)]
    print(f"{name:15} alpha >= 0: {alpha >= 0}, beta > 0: {beta > 0}, "
          f"grows with the size: {model == sorted(model)}")
"""),
    md("md-busbw", r"""
nccl-tests, NVIDIA's benchmark, prints two bandwidths. **algbw** is $S / t$: what the caller sees.
**busbw** multiplies it by $2(n-1)/n$ for an all-reduce, $(n-1)/n$ for the others: the rate each link
really carried, comparable with the link's speed for any $n$. Over gloo on one machine, the "link" is
memory copies between processes: a few GB/s. NVLink carries hundreds of GB/s; one user measured 783 of
900 GB/s busbw on an HGX H100 (NVIDIA/nccl issue 1264).

**Overlap.** DDP starts a bucket's all-reduce as soon as its gradients are ready, while the backward
pass goes on (chapter 6). FSDP gathers each layer's weights just before its backward and reduce-scatters
its gradients just after (chapter 8). What the backward pass cannot hide is **exposed**.
`commcost.simulate_backward` plays a backward pass and its collectives on the simulated device of chapter 4,
with a `comm` lane for the collectives' stream. The model above gives each collective's time.
"""),
    code("comm-predict", r"""
first_bucket = commcost.DDP_FIRST_BUCKET_BYTES  # DDP's first bucket: 1 MiB
mlp = runs["chapter 5's MLP"][0]
grad_bytes = sum(4 * p.numel() for p in mlp.parameters())
buckets = "one bucket" if grad_bytes <= first_bucket else "several"
print(f"chapter 5's MLP: {grad_bytes:,} bytes of gradients; DDP's first bucket "
      f"holds {first_bucket:,}: {buckets}")
block = runs["block, h=256, 128 tokens"][0]
block_bytes = 4 * sum(p.numel() for p in block.parameters())
print(f"one block: {block_bytes:,} bytes of weights, gathered and reduce-scattered")
"""),
    code("comm-overlap", r"""
def predict(collective, nbytes):
    return commcost.collective_seconds(collective, 2, nbytes, *fits[collective])


# backward takes about two thirds of a step; each layer's share follows its weights
linears = [m for m in mlp.modules() if isinstance(m, nn.Linear)][::-1]  # backward order
weights = [m.weight.numel() for m in linears]
backward = [2 / 3 * steps["chapter 5's MLP"] * w / sum(weights) for w in weights]
one_bucket = [("all-reduce", predict("all_reduce", grad_bytes), len(linears) - 1)]
per_layer = [(f"all-reduce {k}", predict("all_reduce", 4 * m.weight.numel()
                                         + 4 * m.bias.numel()), k)
             for k, m in enumerate(linears)]
layers = 4  # four blocks, each an FSDP unit
block_backward = [2 / 3 * steps["block, h=256, 128 tokens"]] * layers
gather = [(f"all-gather {k}", predict("all_gather", block_bytes), k)
          for k in range(layers)]
scatter = [(f"reduce-scatter {k}", predict("reduce_scatter", block_bytes), k)
           for k in range(layers)]
cases = {
    "DDP, chapter 5's MLP": commcost.simulate_backward(backward, one_bucket),
    "DDP, one bucket per layer": commcost.simulate_backward(backward, per_layer),
    "FSDP, four blocks": commcost.simulate_backward(block_backward, scatter, gather)}
fig, axes = plt.subplots(3, 1, figsize=(8, 4.6))
for ax, (title, sim) in zip(axes, cases.items(), strict=True):
    d2l_ext.plot_simulated_timeline(sim.spans(), ax=ax, title=title, legend=False)
plt.tight_layout()
plt.show()
work = [backward, backward, block_backward]
for (title, sim), seconds in zip(cases.items(), work, strict=True):
    print(f"{title}: backward {sum(seconds) * 1e3:.2f} ms, "
          f"exposed {(sim.now() - sum(seconds)) * 1e3:.2f} ms")
""", tags=["nbval-ignore-output"]),
    code("comm-exposed-check", r"""
# whatever the timings: the simulated device exposes what chapter 6's schedule says
ddp = cases["DDP, one bucket per layer"]
by_schedule = commcost.exposed_after_backward(
    backward, [1] * len(backward), [seconds for _, seconds, _ in per_layer])
print("simulated exposed time equals the schedule's:",
      abs(ddp.now() - sum(backward) - by_schedule) < 1e-8)
"""),
    md("md-overlap-read", r"""
Over gloo between two processes, α is hundreds of µs or more. Chapter 5's MLP fits in DDP's first bucket,
and its one all-reduce takes longer than its whole backward pass, so it is all exposed. Three buckets, one per
layer, do not help: each pays α again, and there is little backward work to hide them behind. The blocks
are different: each block's backward is long, so each all-gather and reduce-scatter hides behind a
neighbour's, and only the first all-gather and the last reduce-scatter are exposed.

Overlap pays when each collective is shorter than the backward work beside it: larger layers, a faster
link. That is why DDP's buckets are 25 MiB and FSDP wraps whole blocks. On GPUs with NVLink, α is some µs
and β hundreds of GB/s (10.6, problem 2).
"""),
    md("md-10-6", r"""
## 10.6 Worked problems

Each answer below is computed from the table of 10.1 and the formulas of `roofline`, so that a wrong
figure would show. Try each before you read the answer.

1. From what batch $B$ is an $(B, 8192) \times (8192, 8192)$ product in bfloat16 compute-bound on an H100?
2. Data parallelism on 8 H100s over NVLink (450 GB/s each way): from how many tokens per GPU per step does
   the backward pass hide the gradients' all-reduce? And over a 50 GB/s network?
3. Tensor parallelism of an MLP with a hidden width of 28,672 (Llama 3 70B's): above what degree does it
   wait more for its all-reduce than it computes, over NVLink?
4. How long does one step of 1 million tokens take for an 8-billion-parameter model on 8 H100s at 40% MFU?
5. How many tokens per second can one sequence of a 7-billion-parameter model generate, in 16-bit, on a
   T4 and on an H100?
6. How many H100s train that 8-billion-parameter model on 15 trillion tokens in 30 days at 40% MFU?
"""),
    code("problems", r"""
nvlink, network = 450e9, 50e9
print("1. batch", roofline.compute_bound_batch("H100", "bfloat16", 8192, 8192))
fast, slow = (roofline.dp_hiding_tokens("H100", "bfloat16", link, 8)
              for link in (nvlink, network))
print(f"2. {fast:,.0f} tokens over NVLink, {slow:,.0f} over the network")
degree = roofline.tp_comm_bound_degree("H100", "bfloat16", nvlink, 28672)
print(f"3. degree {degree:.1f}")
step = roofline.training_seconds(8e9, 1e6, 8, "H100", "bfloat16", 0.4)
print(f"4. {step:.1f} s per step")
speeds = {gpu: roofline.decode_tokens_per_second(7e9, "float16", gpu)
          for gpu in ("T4", "H100")}
print("5. tokens/s:", ", ".join(f"{gpu} {rate:.0f}" for gpu, rate in speeds.items()))
days = roofline.training_seconds(8e9, 15e12, 1, "H100", "bfloat16", 0.4) / 86400
print(f"6. {days / 30:,.0f} GPUs ({days:,.0f} GPU-days)")
""", tags=["exact"]),
    md("md-problems-read", r"""
Read the answers as the reference works do. (1) A matrix product needs about as many rows as the ridge
(295) to keep an H100 busy: serving one user at a time is memory-bound. (2) The threshold does not depend
on the model's size, and a slow network raises it nine times. (3) Tensor parallelism fits in one 8-GPU
machine, not across machines. (4, 6) Training time is $6PT$ FLOPs over what the GPUs deliver. (5)
Generating one token reads every weight once: memory, not compute, sets the speed. Each answer rests on
the assumptions in its function's docstring: say them when you quote the number.
"""),
    md("md-10-7", r"""
## 10.7 On a GPU

On a GPU, the cell below measures its roofline (a 4096 matrix product in 16-bit, and an add) and compares
the peak with the spec sheet, when the table knows the GPU. It then draws the roofline with the course's
operations on it, in float32. Beside it are the spec sheets' roofs of a T4, an A100 and an H100, and the
recorded best matrix products of the A100 and H100 (below). Without a GPU it says so.
"""),
    code("gpu-roofline", r"""
# recorded: the largest matrix product each GPU reached in bfloat16, TFLOP/s (MAMF,
# Stas Bekman's Machine Learning Engineering, mamf-finder.py); not measured here
MAMF = {"A100": 271.2, "H100": 794.5}
if d2l_ext.needs_gpus(1):
    dtype = d2l_ext.autocast_dtype(device.type)  # bfloat16, or float16 if faster
    gpu_peak, gpu_bandwidth = roofline.measure_machine(device, dtype, size=4096,
                                                       numel=1 << 26)
    print(f"{dtype}: {gpu_peak / 1e12:.1f} TFLOP/s, {gpu_bandwidth / 1e9:.0f} GB/s, "
          f"ridge {gpu_peak / gpu_bandwidth:.0f} FLOP/B")
    name = torch.cuda.get_device_name() if device.type == "cuda" else device.type
    known = [gpu for gpu in roofline.GPUS if gpu in name]
    if known:
        spec = roofline.peak_flops(known[0], str(dtype).removeprefix("torch."))
        share = gpu_peak / spec
        print(f"{name}: {share:.0%} of its spec sheet's {spec / 1e12:.0f} TFLOP/s")

    def waited(op):  # each run waits for the GPU (measure_machine does the same)
        return lambda: (op.run(), d2l_ext.synchronize(device))

    gpu_ops = roofline.course_operations(device)  # in float32, as in 10.3
    reached = {op.name: op.flops / d2l_ext.measure(waited(op), min_run_time=0.05).median
               for op in gpu_ops}
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    grid = torch.logspace(-2, 4, 100).tolist()
    ax.loglog(grid, [roofline.attainable(i, gpu_peak, gpu_bandwidth) / 1e12
                     for i in grid], "k-", label=f"{name}, measured")
    for gpu in ("T4", "A100", "H100"):  # spec sheets, 16-bit (roofline.GPUS)
        peak_16 = roofline.peak_flops(gpu, "float16")
        bandwidth_16 = roofline.gpu_spec(gpu).bandwidth
        ax.loglog(grid, [roofline.attainable(i, peak_16, bandwidth_16) / 1e12
                         for i in grid], ":", label=f"{gpu} spec sheet")
    for gpu, tflops in MAMF.items():
        ax.axhline(tflops, linestyle="--", linewidth=0.8,
                   label=f"{gpu} MAMF (recorded)")
    for op in gpu_ops:
        ax.plot(op.intensity, reached[op.name] / 1e12, "o", label=op.name)
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    plt.show()
""", tags=["device-dependent"]),
    md("md-gpu-figures", r"""
**Recorded figures** (not measured here):

* The largest matrix product an H100 SXM reaches is about 794.5 of its 989 TFLOP/s in bfloat16 (80%);
  an A100 SXM 271.2 of 312 (87%); an MI300X 668.4 of about 1,300 (51%): Stas Bekman's *Machine Learning
  Engineering*, "maximum achievable matmul FLOPS" (MAMF), measured with its `mamf-finder.py`.
* Training runs report MFU: the Ultra-Scale Playbook's picotron reached about 38% on LLaMA-2-7B with 64
  H100s, and about 50% on SmolLM-1.7B with 8 H100s.
"""),
    md("md-summary", r"""
## Summary

* Two hardware numbers bound every operation: peak FLOP/s and memory bandwidth. Their ratio, the ridge
  point, is about 295 FLOP/B for an H100 in 16-bit, and a few FLOP/B for the CPU this course is tested on.
* An operation's arithmetic intensity (FLOPs per byte) says which bound it meets: element-wise operations
  are memory-bound everywhere; large matrix products are compute-bound.
* `FlopCounterMode` counts matrix products and convolutions exactly; a training step is about 3 times the
  forward, less the first layer's input gradient.
* MFU compares a step with the peak; checkpointing raises HFU, not MFU.
* A collective costs $\alpha$ per step plus its bytes over $\beta$; busbw compares links across $n$.
* The answers to scaling questions follow from these few numbers.

**Read more:** PyTorch's [`torch.utils.flop_counter`](https://docs.pytorch.org/docs/stable/flop_counter.html)
and [benchmark recipe](https://docs.pytorch.org/tutorials/recipes/recipes/benchmark.html),
[How to Scale Your Model](https://jax-ml.github.io/scaling-book/) (chapters 1 and 2), the
[Ultra-Scale Playbook](https://huggingface.co/spaces/nanotron/ultrascale-playbook), and
[nccl-tests' performance notes](https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
"""),
    md("md-exercises", r"""
## Exercises

1. Count the FLOPs of chapter 5's MLP step at batch 1, 128 and 4096, and its bytes (weights read twice,
   gradients written once, activations written and read once, in float32). From what batch is it
   compute-bound on this CPU? On a T4 in float32 (its ridge: 8.1 TFLOP/s over 320 GB/s)?
2. Fit $\alpha$ and $\beta$ from the all-gather times of 10.5 using only sizes up to 64 KiB, then predict
   the time at 4 MiB. How far off is it, and why?
3. A model of 70 billion parameters is served in bfloat16 on one H100 (it does not fit: assume it did).
   How many tokens per second can one sequence get? How many sequences at once before the GPU becomes
   compute-bound?

[Solutions](solutions/10_how_fast.ipynb)
"""),
]

SOLUTIONS = [
    md("sol-intro", r"""
# Solutions: 10. How fast can it go?

[Back to the chapter](../10_how_fast.ipynb)
"""),
    code("sol-imports", r"""
import re

import d2l_ext
from d2l_ext import commcost, roofline
"""),
    md("sol-1", r"""
## 1. When does chapter 5's MLP step become compute-bound?

Its weights are 32 × 256, 256 × 256 and 256 × 10. Bytes: each weight read twice and its gradient written
once, $4 \times 3P$, and each activation written and read once, $4 \times 2 \cdot b \cdot (32 + 256 + 256 + 10)$.
"""),
    code("sol-1-code", r"""
sizes = [32, 256, 256, 10]
weights = sum(a * b for a, b in zip(sizes, sizes[1:], strict=False))


def intensity(batch):
    flops = roofline.mlp_step_flops(batch, sizes)["total"]
    nbytes = 4 * (3 * weights + 2 * batch * sum(sizes))
    return flops, nbytes, flops / nbytes


for batch in (1, 128, 4096):
    flops, nbytes, i = intensity(batch)
    print(f"batch {batch:5}: {flops:>13,} FLOPs, {nbytes:>11,} bytes, {i:6.2f} FLOP/B")
""", tags=["exact"]),
    code("sol-1-cpu", r"""
def first_batch_above(ridge):
    batch = 1
    while intensity(batch)[2] <= ridge:
        batch += 1
    return batch


highest = max(roofline.CPU_RIDGES.values())
print(f"this CPU, every setting of 10.3 (ridge up to {highest} FLOP/B): "
      f"from a batch of {first_batch_above(highest)}")
""", tags=["exact"]),
    code("sol-1-ridges", r"""
peak, bandwidth = roofline.measure_machine("cpu")
print(f"this run: ridge {peak / bandwidth:.1f} FLOP/B, "
      f"from a batch of {first_batch_above(peak / bandwidth)}")
""", tags=["nbval-ignore-output"]),
    code("sol-1-t4", r"""
ridge_t4 = roofline.ridge_point("T4", "float32")
print(f"T4 in float32 (ridge {ridge_t4:.1f} FLOP/B): from a batch of "
      f"{first_batch_above(ridge_t4)}")
print(f"at a batch of 2**20: {intensity(2**20)[2]:.1f} FLOP/B; T4 float16's ridge: "
      f"{roofline.ridge_point('T4', 'float16'):.0f}")
""", tags=["exact"]),
    md("sol-1-read", r"""
The intensity grows with the batch but levels off near 100 FLOP/B: once the activations' bytes dominate,
each row brings about $6 \sum n_i m_i$ FLOPs for $8 \sum n_i$ bytes. That is above this CPU's ridge from a
small batch on, and above a T4's float32 ridge (25) from a batch of a few dozen; but a T4's Tensor Cores in
float16 (ridge 203) would wait for memory at any batch. Wider layers, not larger batches, change that.
"""),
    md("sol-2", r"""
## 2. Predicting large sizes from small ones

Timed on the script's output; the numbers change from run to run.
"""),
    code("sol-2-code", r"""
output = d2l_ext.torchrun("../scripts/collectives.py", nproc=2, timeout=300,
                          args=["--largest-mib", "4"], echo=False)
points = [(int(s), float(t)) for s, t in
          re.findall(r"time all_gather (\d+) ([\d.]+)", output)]
small = [(s, t) for s, t in points if s <= 64 * 1024]
size, measured = points[-1]
try:
    alpha, beta = commcost.fit_alpha_beta("all_gather", 2, *zip(*small, strict=True))
except ValueError as error:  # latency alone: the times may not even grow
    print(f"from sizes up to 64 KiB: {error}")
else:
    predicted = commcost.collective_seconds("all_gather", 2, size, alpha, beta)
    print(f"from sizes up to 64 KiB: alpha {alpha * 1e6:.0f} us, "
          f"beta {beta / 1e9:.2f} GB/s")
    print(f"4 MiB: predicted {predicted * 1e3:.1f} ms, "
          f"measured {measured * 1e3:.1f} ms")
""", tags=["nbval-ignore-output"]),
    md("sol-2-read", r"""
Small messages are dominated by latency, so they say little about the bandwidth: the fit's $\beta$ is
poorly known, and the prediction for 4 MiB can be off by a large factor either way. When the small times
do not even grow with the size, no bandwidth can be fitted at all, and `fit_alpha_beta` says so. Fit
$\beta$ on large messages and $\alpha$ on small ones, as nccl-tests users do by reading both ends of a
sweep.
"""),
    md("sol-3", r"""
## 3. Serving a 70-billion-parameter model

Each generated token reads every weight once (140 GB in bfloat16). With $k$ sequences at once, one read of
the weights serves $k$ tokens: the intensity is about $k$ FLOP/B ($2P$ FLOPs per token, $2P$ bytes per
read), so the GPU becomes compute-bound near $k$ = the ridge.
"""),
    code("sol-3-code", r"""
per_sequence = roofline.decode_tokens_per_second(70e9, "bfloat16", "H100")
ridge = roofline.ridge_point("H100", "bfloat16")
print(f"one sequence: {per_sequence:.1f} tokens/s")
print(f"compute-bound from about {ridge:.0f} sequences at once "
      f"({ridge * per_sequence:,.0f} tokens/s in all)")
""", tags=["exact"]),
]


def write(cells, path, kernel_source):
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata = kernel_source.metadata
    nbformat.write(nb, path)


template = nbformat.read(ROOT / "notebooks" / "09_model_parallel.ipynb", as_version=4)
write(CHAPTER, ROOT / "notebooks" / NAME, template)
write(SOLUTIONS, ROOT / "notebooks" / "solutions" / NAME, template)
print("written")

"""How much memory does training a model take? An estimate a learner can check, and the measurement to check it.

One training step holds four kinds of tensors:

- **parameters**: P numbers, 4 bytes each in float32. Under mixed precision they stay in float32 (the *master
  weights*) and autocast makes a 16-bit copy of each weight a matrix product uses, which autograd keeps;
- **gradients**: one per parameter, in the parameter's dtype;
- **optimizer state**: SGD keeps nothing, momentum one buffer the size of the parameters, Adam two (and a
  4-byte step counter per parameter tensor);
- **activations**: what autograd saves in the forward pass for the backward pass. They grow with the batch.

``estimate_training_memory`` counts the first three from the parameters' shapes, and the activations by running
the forward pass on *fake* tensors (shapes and dtypes, no data): so it costs no memory, also for a batch or a
model far larger than this machine. The four rows are never all alive at once, so their sum is not the peak.
The estimate also follows a steady-state step (a step after the first, so the optimizer's state exists, and
``zero_grad()`` has set the gradients to ``None``) through its three phases and reports the highest total:

- **forward pass**: parameters, optimizer state, the batch, and what the forward pass holds;
- **backward pass**: the same, with the gradients of the saved activations beside them and the parameters'
  gradients as they appear (forward and backward are run on fake tensors, every live tensor counted);
- **optimizer.step()**: parameters, gradients, optimizer state, the batch, and the step's temporaries: Adam
  updating all tensors at once (``foreach``, the default on GPUs) makes one parameter-sized buffer, Adam updating
  one tensor at a time (the CPU's default) two buffers the size of the largest parameter.

``measure_training_memory`` runs one real step and sums the real tensors.
``zero_bytes_per_gpu`` gives the per-GPU bytes of data-parallel training when ZeRO shards the model state.
``estimate_parallel_memory`` gives one rank's rows under FSDP2 times tensor parallelism (chapter 9).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
STATE_BUFFERS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}  # parameter-sized buffers per optimizer
STEP_BYTES = 4  # Adam's step counter: a float32 scalar tensor per parameter tensor
_VIEWS = {"TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0", "ExpandBackward0"}


@dataclass(frozen=True)
class MemoryRow:
    """One kind of tensor held during training: its name, its bytes and how they were counted."""

    name: str
    bytes: int
    formula: str


@dataclass(frozen=True)
class MemoryEstimate:
    """The rows parameters, gradients, optimizer state and activations, their sum, and the peak of a step:
    ``phases`` holds the bytes alive at the highest point of each phase, ``peak_bytes`` the largest of them."""

    rows: tuple[MemoryRow, ...]
    phases: tuple[MemoryRow, ...]
    sum_formula: str = "parameters + gradients + optimizer state + activations"

    @property
    def sum_bytes(self) -> int:
        return sum(row.bytes for row in self.rows)

    @property
    def peak(self) -> MemoryRow:
        """The phase that holds the most bytes (the earlier one on a tie)."""
        if not self.phases:
            raise ValueError("this estimate has rows only, no phases: it has no peak")
        return max(self.phases, key=lambda phase: phase.bytes)

    @property
    def peak_bytes(self) -> int:
        return self.peak.bytes

    @property
    def peak_phase(self) -> str:
        return self.peak.name

    def __getitem__(self, name: str) -> int:
        if name == "peak":
            return self.peak_bytes
        if name == "sum of rows":
            return self.sum_bytes
        for row in (*self.rows, *self.phases):
            if row.name == name:
                return row.bytes
        names = [row.name for row in (*self.rows, *self.phases)] + ["sum of rows", "peak"]
        raise KeyError(f"{name!r}: the names are {names}")

    def table(self, unit: float = 1e6, unit_name: str = "MB", phases: bool = False) -> str:
        """Return the rows, their sum and the peak (with its phase) as aligned text, in ``unit_name`` (``unit``
        bytes each); ``phases=True`` adds each phase's highest total."""
        rows = [*self.rows, MemoryRow("sum of rows", self.sum_bytes, self.sum_formula),
                *(self.phases if phases else ())]
        if self.phases:
            rows.append(MemoryRow("peak", self.peak_bytes, f"{self.peak_phase}: {self.peak.formula}"))
        width = max(len(row.name) for row in rows)
        return "\n".join(f"{row.name:<{width}} {row.bytes / unit:>10.2f} {unit_name}   {row.formula}"
                         for row in rows)


class _LiveBytes(TorchDispatchMode):
    """Count the bytes of the storages alive, as each operator creates them and as they are freed, and the
    highest count since ``start()``. A view shares its base's storage and costs nothing new."""

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, weakref.ref] = {}
        self.now = 0
        self.highest = 0

    def track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        known = self._refs.get(key)
        if known is not None and known() is storage:
            return
        nbytes = storage.nbytes()

        def freed(_: weakref.ref, key: int = key, nbytes: int = nbytes) -> None:
            self.now -= nbytes
            self._refs.pop(key, None)

        self._refs[key] = weakref.ref(storage, freed)
        self.now += nbytes
        self.highest = max(self.highest, self.now)

    def start(self) -> None:
        self.highest = self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (PyTorch's signature)
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self.track(item)
        return out


def _unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    return list(model.parameters())  # a weight shared by two layers is listed once


def _check_amp(amp: torch.dtype | None, device_type: str) -> None:
    if amp is None:
        return
    if amp not in (torch.bfloat16, torch.float16):
        raise ValueError(f"amp must be None, torch.bfloat16 or torch.float16, not {amp}")
    if device_type == "cuda" and amp == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError("amp=torch.bfloat16: this CUDA GPU cannot compute in bfloat16; use torch.float16")
    if not torch.amp.autocast_mode.is_autocast_available(device_type):
        raise ValueError(f"amp={amp}: autocast is not available on {device_type!r}")


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, dict):
        for item in batch.values():
            yield from _tensors(item)


def _call(model: nn.Module, batch: Any) -> Any:
    return model(*batch) if isinstance(batch, (list, tuple)) else model(batch)


def _first_tensor(output: Any) -> torch.Tensor:
    for tensor in _tensors(output):
        return tensor
    raise ValueError("the model returned no tensor")


def saved_bytes(forward: Callable[[], object]) -> dict[str, int]:
    """Return what autograd saves while ``forward()`` runs: ``activations``, and ``weight copies`` (the 16-bit
    copies autocast makes of parameters). A parameter itself, or a view of it, costs nothing new."""
    saved: dict[int, tuple[str, int]] = {}

    def kind(tensor: torch.Tensor) -> str:
        grad_fn = tensor.grad_fn
        while grad_fn is not None and type(grad_fn).__name__ in _VIEWS:
            grad_fn = grad_fn.next_functions[0][0]
        if grad_fn is None:
            return "parameter" if tensor.is_leaf and tensor.requires_grad else "activations"
        name = type(grad_fn).__name__
        if name == "AccumulateGrad":
            return "parameter"
        if name == "ToCopyBackward0" and type(grad_fn.next_functions[0][0]).__name__ == "AccumulateGrad":
            return "weight copies"
        return "activations"

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        # each storage counts once (ReLU's output is also the next layer's input); a view, its own bytes
        key, nbytes = tensor.untyped_storage()._cdata, tensor.numel() * tensor.element_size()
        saved[key] = (kind(tensor), max(nbytes, saved.get(key, ("", 0))[1]))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    totals = {"activations": 0, "weight copies": 0}
    for name, nbytes in saved.values():
        if name in totals:
            totals[name] += nbytes
    return totals


def _simulation_device(device_type: str) -> str:
    """The device type the fake step runs on: the step's own, if such a device is here (autograd's engine needs
    one for the backward pass), else the CPU (autocast's lists of operations differ a little between devices)."""
    if device_type in ("cpu", "meta"):
        return "cpu"
    module = getattr(torch, device_type, None)
    available = getattr(module, "is_available", None)
    return device_type if available is not None and available() else "cpu"


def _fake_step(model: nn.Module, batch: Any, amp: torch.dtype | None, fake_type: str
               ) -> tuple[dict[str, int], int, int]:
    """Run the forward and backward pass on fake tensors of device type ``fake_type`` (shape and dtype, no memory).
    Return ``saved_bytes``, and the most bytes alive during the forward pass and during the backward pass: the
    parameters, buffers and batch, and every tensor the two passes create, while it lives (the optimizer state is
    not there)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != fake_type:
            with mode:
                return torch.empty(tensor.shape, dtype=tensor.dtype, device=fake_type)
        return mode.from_tensor(tensor)

    memo: dict[int, Any] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = nn.Parameter(fake(parameter.detach()), requires_grad=parameter.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = fake(buffer)
    fake_model = copy.deepcopy(model, memo)  # the same memo keeps a shared weight shared
    fake_batch = _map_tensors(batch, fake)
    live = _LiveBytes()
    for tensor in (*fake_model.parameters(), *fake_model.buffers(), *_tensors(fake_batch)):
        live.track(tensor)
    outputs: list[Any] = []
    autocast = torch.autocast(fake_type, dtype=amp or torch.bfloat16, enabled=amp is not None)
    with mode, live:
        with autocast:
            saved = saved_bytes(lambda: outputs.append(_call(fake_model, fake_batch)))
        loss = _first_tensor(outputs[0]).float().sum()
        forward = live.highest
        live.start()
        if loss.requires_grad:
            loss.backward()
        backward = live.highest
    return saved, forward, backward


def _optimizer_temporaries(trained: list[nn.Parameter], optimizer: str, foreach: bool) -> tuple[int, str]:
    """Return the bytes of the temporaries ``optimizer.step()`` holds at once, and how they are counted."""
    if not optimizer.startswith("adam") or not trained:
        return 0, "no temporaries"  # SGD and momentum update in place
    if foreach:  # torch.optim.Adam: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs), all tensors at once
        size = trained[0].element_size()
        return sum(p.numel() * p.element_size() for p in trained), f"P x {size} B (foreach Adam)"
    largest = max(p.numel() * p.element_size() for p in trained)  # the square root, then its quotient
    return 2 * largest, "2 x the largest parameter (per-tensor Adam)"


def _default_foreach(device_type: str) -> bool:
    """Whether PyTorch's optimizers update all tensors at once by default on this device type."""
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    return device_type in _get_foreach_kernels_supported_devices()


def _map_tensors(batch: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(item, function) for item in batch)
    if isinstance(batch, dict):
        return {key: _map_tensors(item, function) for key, item in batch.items()}
    return batch



def estimate_training_memory(model: nn.Module, example_batch: Any, optimizer: str = "adam",
                             amp: torch.dtype | None = None, device: torch.device | str | None = None,
                             foreach: bool | None = None) -> MemoryEstimate:
    """Estimate the bytes one training step of ``model`` on ``example_batch`` holds, row by row, and the peak
    of a steady-state step with the phase that holds it.

    ``optimizer`` is "sgd", "momentum", "adam" or "adamw"; ``amp`` None (float32) or the autocast dtype;
    ``device`` the device type the step would run on (default: the parameters'); ``foreach`` whether the
    optimizer updates all tensors at once (default: PyTorch's default on that device, True on CUDA). The model
    may live on the ``meta`` device, so a model larger than this machine can be estimated. Nothing real is
    allocated."""
    parameters = _unique_parameters(model)
    if not parameters:
        raise ValueError("the model has no parameters: there is nothing to train")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    device_type = torch.device(device).type if device is not None else parameters[0].device.type
    _check_amp(amp, "cpu" if device_type == "meta" else device_type)
    simulated_on = _simulation_device(device_type)
    try:
        saved, forward, backward = _fake_step(model, example_batch, amp, simulated_on)
    except Exception as err:
        if simulated_on == "cpu":
            raise ValueError(f"the model rejects this batch: {type(err).__name__}: {err}") from err
        try:  # a device whose fake tensors this torch cannot run backward: the CPU's simulation, a close one
            saved, forward, backward = _fake_step(model, example_batch, amp, "cpu")
        except Exception as cpu_err:
            raise ValueError(f"the model rejects this batch: {type(err).__name__}: {err}") from cpu_err
    count = sum(p.numel() for p in parameters)
    param_bytes = sum(p.numel() * p.element_size() for p in parameters)
    trained = [p for p in parameters if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in trained)
    buffers = STATE_BUFFERS[optimizer]
    state_bytes = buffers * grad_bytes + (STEP_BYTES * len(trained) if optimizer.startswith("adam") else 0)
    size = parameters[0].element_size()
    param_formula = f"P x {size} B, P = {count:,}"
    if amp is not None:
        param_formula += f"; + {saved['weight copies']:,} B of {str(amp).split('.')[1]} weight copies autograd keeps"
    state_formula = {0: "SGD keeps none", 1: f"1 buffer x P x {size} B"}.get(
        buffers, f"2 buffers x P x {size} B + {STEP_BYTES} B x {len(trained)} tensors (step)")
    if foreach is None:
        foreach = _default_foreach("cpu" if device_type == "meta" else device_type)
    temporaries, temporaries_formula = _optimizer_temporaries(trained, optimizer, foreach)
    batch_bytes = sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                       for t in _tensors(example_batch)}.values())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    return MemoryEstimate(
        rows=(
            MemoryRow("parameters", param_bytes + saved["weight copies"], param_formula),
            MemoryRow("gradients", grad_bytes, f"P x {size} B (trained parameters)"),
            MemoryRow("optimizer state", state_bytes, f"{optimizer}: {state_formula}"),
            MemoryRow("activations", saved["activations"], "what autograd saves in the forward pass "
                      f"(counted on fake tensors{', under autocast' if amp else ''})"),
        ),
        phases=(
            MemoryRow("forward pass", forward + state_bytes,
                      "parameters + optimizer state + batch + the forward pass's tensors alive"),
            MemoryRow("backward pass", backward + state_bytes,
                      "parameters + optimizer state + batch + saved activations + their gradients + gradients"),
            MemoryRow("optimizer.step()", param_bytes + buffer_bytes + grad_bytes + state_bytes + batch_bytes
                      + temporaries, f"parameters + gradients + optimizer state + batch + {temporaries_formula}"),
        ),
    )


def estimate_parallel_memory(model: nn.Module, example_batch: Any, tp_plan: Mapping[str, str], dp: int, tp: int,
                             optimizer: str = "adam") -> MemoryEstimate:
    """Estimate the bytes one rank holds in a training step of ``model`` on ``example_batch`` (the whole batch, all
    ranks') under FSDP2 over ``dp`` ranks times tensor parallelism over ``tp`` ranks: the rows parameters,
    gradients, optimizer state and activations of chapter 8's estimate, per rank (no phases, so no peak).

    ``tp_plan`` maps ``nn.Linear`` modules' names to "colwise" (weight and bias split by output features, as
    ColwiseParallel does) or "rowwise" (weight split by input features, bias whole: RowwiseParallel). The rule:
    chapter 8's estimator runs on one rank's shapes, each planned layer replaced by its slice and the batch by
    its 1/dp. So what the forward pass saves inside the tensor-parallel region (from a colwise layer's output to
    a rowwise layer's input) comes out divided by tp, and what it saves outside (the colwise layer's input,
    norms, residuals) whole: every tp rank holds those. Then FSDP2 splits every parameter by dp along its first
    dimension, and its gradient and optimizer state with it; a shard is rounded up (FSDP2 pads every rank's
    shard to the largest), Adam's step counters are counted whole on each rank. The batch is split along its
    first dimension.

    Approximate: the forward pass must run on the local shapes, as it must under parallelize_module (take the
    number of heads from the width, not from a constant), else ValueError; the buffers of the collectives and
    the parameters FSDP2 gathers for the layers it computes are in no row (they count at the peak, not estimated
    here). Nothing real is allocated."""
    if dp < 1 or tp < 1:
        raise ValueError(f"dp and tp must be at least 1, not dp={dp}, tp={tp}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    memo: dict[int, Any] = {id(t): nn.Parameter(t.detach().to("meta"), requires_grad=t.requires_grad)
                            for t in model.parameters()}
    memo.update({id(b): b.to("meta") for b in model.buffers()})
    local = copy.deepcopy(model, memo)  # on the meta device: nothing copied
    for name, style in tp_plan.items():
        try:
            layer = local.get_submodule(name) if name else None
        except AttributeError:
            layer = None
        if layer is None:
            raise ValueError(f"tp_plan names {name!r}, which is no module of the model")
        if style not in ("colwise", "rowwise"):
            raise ValueError(f"tp_plan[{name!r}] is {style!r}, not 'colwise' or 'rowwise'")
        if not isinstance(layer, nn.Linear):
            raise ValueError(f"tp_plan[{name!r}]: {type(layer).__name__} is not an nn.Linear")
        split, features = ("output", layer.out_features) if style == "colwise" else ("input", layer.in_features)
        if features % tp:
            raise ValueError(f"tp={tp} does not divide the {features} {split} features of {name!r}")
        shape = ((layer.in_features, features // tp) if style == "colwise" else (features // tp, layer.out_features))
        piece = nn.Linear(*shape, bias=layer.bias is not None, device="meta", dtype=layer.weight.dtype)
        local.set_submodule(name, piece.requires_grad_(layer.weight.requires_grad))

    def one_rank(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0 or tensor.shape[0] % dp:
            raise ValueError(f"dp={dp} does not divide the batch of {tensor.shape[0] if tensor.dim() else 0}")
        return torch.empty((tensor.shape[0] // dp, *tensor.shape[1:]), dtype=tensor.dtype, device="meta")

    try:
        rank = estimate_training_memory(local, _map_tensors(example_batch, one_rank), optimizer)
    except ValueError as err:
        raise ValueError(f"on one rank's shapes (tp={tp}, dp={dp}): {err}") from err

    def shard(p: nn.Parameter) -> int:  # FSDP2's shard of dim 0, rounded up
        rows = p.shape[0] if p.dim() else 1
        return -(-rows // dp) * (p.numel() // max(rows, 1)) * p.element_size()

    parameters = _unique_parameters(local)
    trained = [p for p in parameters if p.requires_grad]
    grad_bytes = sum(shard(p) for p in trained)
    steps = STEP_BYTES * len(trained) if optimizer.startswith("adam") else 0
    return MemoryEstimate(rows=(
        MemoryRow("parameters", sum(shard(p) for p in parameters),
                  f"one rank's slice (tp={tp}), / dp={dp} along dim 0: split / (tp x dp), whole / dp"),
        MemoryRow("gradients", grad_bytes, "as the parameters (trained ones)"),
        MemoryRow("optimizer state", STATE_BUFFERS[optimizer] * grad_bytes + steps,
                  f"{optimizer}: {STATE_BUFFERS[optimizer]} x the gradients + {steps} B of step counters"),
        MemoryRow("activations", rank["activations"],
                  f"chapter 8's count on one rank's shapes: batch / {dp}, the TP region / {tp}"),
    ), phases=())


def make_optimizer(parameters: list[nn.Parameter], optimizer: str) -> torch.optim.Optimizer:
    """Return the optimizer named ``optimizer`` ("sgd", "momentum", "adam", "adamw") over ``parameters``."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    if optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=0.01)
    if optimizer == "momentum":
        return torch.optim.SGD(parameters, lr=0.01, momentum=0.9)
    return (torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW)(parameters, lr=1e-3)


def measure_training_memory(model: nn.Module, example_batch: Any, optimizer: str = "adam",
                            amp: torch.dtype | None = None) -> dict[str, int]:
    """Run one real training step on a copy of ``model`` and sum the real tensors of each kind, in bytes:
    parameters (with autocast's weight copies), gradients, ``optimizer.state`` after the step, and the
    activations autograd saved, and their sum. The loss is the sum of the output, so the model's own layers are
    counted. (The peak of a step is measured by tracking every tensor, as chapter 8.2 does with MemTracker.)"""
    model = copy.deepcopy(model)
    parameters = _unique_parameters(model)
    if not parameters:
        raise ValueError("the model has no parameters: there is nothing to train")
    device_type = parameters[0].device.type
    _check_amp(amp, device_type)
    opt = make_optimizer(parameters, optimizer)
    outputs: list[Any] = []
    with torch.autocast(device_type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        saved = saved_bytes(lambda: outputs.append(_call(model, example_batch)))
    _first_tensor(outputs[0]).float().sum().backward()
    opt.step()
    state = sum(t.numel() * t.element_size() for values in opt.state.values()
                for t in values.values() if isinstance(t, torch.Tensor))
    measured = {
        "parameters": sum(p.numel() * p.element_size() for p in parameters) + saved["weight copies"],
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in parameters if p.grad is not None),
        "optimizer state": state,
        "activations": saved["activations"],
    }
    measured["sum of rows"] = sum(measured.values())
    return measured


def zero_bytes_per_gpu(parameters: float, gpus: int, stage: int, k: int = 12) -> float:
    """Bytes of model state per GPU in mixed-precision data-parallel training with Adam, as the ZeRO paper
    counts them: 2 bytes per parameter for 16-bit weights, 2 for 16-bit gradients, ``k`` for the optimizer
    state (12 for Adam: float32 master weights, momentum and variance). Stage 0 is plain data parallelism
    (DDP); stage 1 shards the optimizer state over ``gpus``, stage 2 the gradients too, stage 3 (FSDP) all."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO has stages 0 (none), 1, 2 and 3, not {stage}")
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, not {gpus}")
    p, n = parameters, gpus
    return {0: (4 + k) * p, 1: 4 * p + k * p / n, 2: 2 * p + (2 + k) * p / n, 3: (4 + k) * p / n}[stage]

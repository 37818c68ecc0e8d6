"""d2l_ext.memory: the report on the CPU, on a GPU (what torch reports controlled), and the table."""

import torch

from d2l_ext import memory

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only


def test_cpu_report_is_the_process_resident_memory():
    before = memory.memory_report("cpu")["process resident"]
    block = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB, touched
    after = memory.memory_report("cpu")["process resident"]
    assert set(memory.memory_report("cpu")) == {"process resident"}
    assert after - before >= 48 * 2**20
    del block


def test_gpu_report_reads_the_allocator_counters(monkeypatch):
    counters = {"memory_allocated": 100, "memory_reserved": 200, "max_memory_allocated": 300,
                "max_memory_reserved": 400}
    asked = []
    for name, value in counters.items():
        monkeypatch.setattr(torch.accelerator, name,
                            lambda index=None, value=value: asked.append(index) or value)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    report = memory.memory_report("cuda:1")
    assert report == {"allocated": 100, "reserved": 200, "peak allocated": 300, "peak reserved": 400}
    assert set(asked) == {1}  # the index named, not the current device
    memory.memory_report("cuda")
    assert asked[-1] == 0  # no index: the current device


def test_torch_without_accelerator_counters_falls_back_to_torch_cuda(monkeypatch):
    """On torch < 2.9 torch.accelerator has no memory counters: torch.cuda's are read, for its current device."""
    monkeypatch.delattr(torch.accelerator, "memory_allocated")
    assert memory._memory_module(torch.device("cuda")) is torch.cuda
    asked = []
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, lambda index=None: asked.append(index) or 7)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    report = memory.memory_report("cuda")
    assert report == {"allocated": 7, "reserved": 7, "peak allocated": 7, "peak reserved": 7}
    assert asked == [3, 3, 3, 3]  # no index: torch.cuda's current device
    memory.memory_report("cuda:1")
    assert asked[-4:] == [1, 1, 1, 1]


def test_mps_report_never_asks_torch_accelerator(monkeypatch):
    """torch.accelerator's memory functions raise on MPS in some versions: torch.mps's counters are read."""
    def refuse(index=None):
        raise RuntimeError("Allocator for mps is not a DeviceAllocator")

    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        monkeypatch.setattr(torch.accelerator, name, refuse)
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 11)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 22)
    assert memory.memory_report("mps") == {"allocated": 11, "reserved": 22}
    assert memory.memory_report("mps:0") == {"allocated": 11, "reserved": 22}
    assert memory._memory_module(torch.device("cuda")) is torch.accelerator
    assert memory._memory_module(torch.device("mps")) is torch.mps


def test_table_is_aligned_in_mib():
    rows = [("start", {"allocated": 0, "reserved": 0}),
            ("after allocating", {"allocated": 256 * 2**20, "reserved": 256 * 2**20})]
    lines = memory.memory_table(rows).splitlines()
    assert len(lines) == 3 and len({len(line) for line in lines}) == 1
    assert "allocated (MiB)" in lines[0] and lines[2].split()[-1] == "256.0"


def test_the_allocators_step_peak_leaves_out_earlier_tensors_and_workspaces(monkeypatch):
    """A pretend allocator: earlier cells' tensors and a cuBLAS workspace are alive before the second step;
    the step's peak is the kept tensors (parameters, Adam's state, batch) plus what the step adds."""
    earlier, workspace, activations = 1000, 8 * 2**20, 5000
    model, batch = torch.nn.Linear(4, 3), torch.randn(2, 4)
    optimizer = torch.optim.Adam(model.parameters())
    allocator = {"allocated": earlier, "peak": earlier, "steps": 0}

    def tensor_bytes(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    def step():
        if allocator["steps"] == 0:  # the model and batch move to the GPU, then Adam's state and the workspace appear
            model(batch).sum().backward()
            optimizer.step()
            kept = [*model.parameters(), batch] + [t for s in optimizer.state.values() for t in s.values()]
            allocator["allocated"] += tensor_bytes(kept) + workspace
        allocator["steps"] += 1
        allocator["peak"] = max(allocator["peak"], allocator["allocated"] + activations)

    def reset():
        allocator["peak"] = allocator["allocated"]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *args: allocator["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *args: allocator["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    peak, other = memory.allocator_step_peak(step, model, optimizer, batch)
    state = [t for s in optimizer.state.values() for t in s.values()]
    assert allocator["steps"] == 2
    assert peak == tensor_bytes([*model.parameters(), batch, *state]) + activations
    assert other == earlier + workspace

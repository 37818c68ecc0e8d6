"""Chapter 12's helpers: d2l_ext.kernels (inputs refused, the bounds checker, device decisions, occupancy),
d2l_ext.kernel_compile (facts read off the compiler for GPUs this machine lacks) and the chapter's pictures.

The interpreter tests set TRITON_INTERPRET with monkeypatch, so that it never leaks into another test."""

from __future__ import annotations

import sys
import types

import matplotlib
import pytest
import torch

from d2l_ext import diagrams_kernels, hardware, kernel_compile, kernels

matplotlib.use("Agg")
needs_triton = pytest.mark.skipif(not kernels.triton_importable(), reason="Triton has Linux wheels only")
needs_numba = pytest.mark.skipif(not kernels.numba_importable(), reason="numba is not installed")

ADD = '''
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)
'''
# the planted bug: loads masked, the store not
UNMASKED = ADD.replace("add_kernel", "add_unmasked").replace("x + y, mask=mask)", "x + y)")
ADD_TYPES = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


@pytest.fixture
def interpreted(monkeypatch, tmp_path):
    """Return a function that defines kernels from source under the interpreter, as the chapter does."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def define(source: str, name: str):
        path = tmp_path / f"{name}.py"  # triton reads a kernel's source from its file
        path.write_text("import triton\nimport triton.language as tl\n" + source)
        return getattr(kernel_compile.import_file(path), name)

    return define


@needs_triton
def test_the_add_runs_in_the_interpreter_and_its_bytes_are_counted(interpreted):
    add = interpreted(ADD, "add_kernel")
    assert type(add).__name__ == "InterpretedFunction"
    x, y, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    moved = kernels.launch(add, (4,), x, y, out, 1000, BLOCK=256)
    assert moved.counted
    assert torch.equal(out, x + y)
    assert (moved.read, moved.written) == (8000, 4000)


@needs_triton
def test_a_planted_unmasked_store_is_caught_before_it_writes(interpreted):
    bad = interpreted(UNMASKED, "add_unmasked")
    x, y, out = torch.randn(100), torch.randn(100), torch.zeros(100)
    with pytest.raises(kernels.OutOfBounds) as caught:
        kernels.launch(bad, (1,), x, y, out, 100, BLOCK=128)
    message = str(caught.value)
    assert message.startswith("add_unmasked: store out of bounds of out_ptr (100 elements of float32)")
    assert "at element offset 100" in message and "program (0, 0, 0)" in message
    assert bool((out == 0).all())  # nothing written: the check runs before the store


@needs_triton
@pytest.mark.parametrize(("block", "problem"), [(100, "BLOCK=100 is not a power of two"),
                                                 (0, "BLOCK=0 is not a power of two")])
def test_a_block_that_is_not_a_power_of_two_is_refused(interpreted, block, problem):
    add = interpreted(ADD, "add_kernel")
    x = torch.randn(100)
    with pytest.raises(ValueError, match=problem):
        kernels.launch(add, (1,), x, x, torch.empty(100), 100, BLOCK=block)


@needs_triton
def test_wrong_device_not_contiguous_and_bf16_are_refused(interpreted):
    add = interpreted(ADD, "add_kernel")
    x, out = torch.randn(8, 100), torch.empty(100)
    with pytest.raises(ValueError, match="x_ptr is not contiguous"):
        kernels.launch(add, (1,), x[:, 0], x[:, 1], out[:8], 8, BLOCK=8)
    with pytest.raises(ValueError, match="y_ptr is bfloat16, which Triton's interpreter computes wrongly"):
        kernels.launch(add, (1,), x[0], x[1].bfloat16(), out, 100, BLOCK=128)
    with pytest.raises(ValueError, match="out_ptr is on meta, the kernel runs on cpu"):
        kernels.launch(add, (1,), x[0], x[1], torch.empty(100, device="meta"), 100, BLOCK=128)


def test_check_block_accepts_powers_of_two_only():
    for block in (1, 2, 16, 1024):
        kernels.check_block("BLOCK", block)
    for block in (3, 100, -4, 0, 2.0, True):
        with pytest.raises(ValueError, match="not a power of two"):
            kernels.check_block("BLOCK", block)  # pyright: ignore[reportArgumentType] (what a learner may pass)


def test_an_unknown_gpu_target_is_refused():
    with pytest.raises(ValueError, match="unknown GPU target 'sm_75': the chapter knows sm_80, sm_90, gfx942"):
        kernel_compile.CompileJob(ADD, ADD_TYPES, {"BLOCK": 1024}, "sm_75")
    with pytest.raises(ValueError, match="not arguments of the kernel"):
        kernel_compile.CompileJob(ADD, ADD_TYPES, {"BLOCK": 1024}, "sm_90", ("z_ptr",))


@needs_triton
def test_the_compiler_facts_for_an_h100_an_a100_and_an_mi300x(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as in the notebook: the child must not inherit it
    pointers = ("x_ptr", "y_ptr", "out_ptr", "n")
    jobs = [kernel_compile.CompileJob(ADD, ADD_TYPES, {"BLOCK": 1024}, "sm_90"),
            kernel_compile.CompileJob(ADD, ADD_TYPES, {"BLOCK": 1024}, "sm_90", pointers),
            kernel_compile.CompileJob(ADD, ADD_TYPES, {"BLOCK": 1024}, "gfx942", pointers)]
    plain, aligned, amd = kernel_compile.compile_facts(jobs)
    # triton 3.8.0's output (torch 2.14.1's): 8 elements per thread, scalar or 16-byte loads
    assert (plain.loads(), plain.stores(), plain.size_per_thread) == ({"ld.global.b32": 16}, {"st.global.b32": 8}, [1])
    assert (aligned.loads(), aligned.stores()) == ({"ld.global.v4.b32": 4}, {"st.global.v4.b32": 2})
    assert amd.loads() == {"global_load_dwordx4": 2} and amd.registers > 0
    assert plain.shared == 0 and plain.mma == [] and aligned.registers > 0


def test_the_compile_child_does_not_interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "TRITON_INTERPRET" not in kernel_compile.child_environment()


# ---- device decisions, with what torch reports controlled ----

def _gpus(monkeypatch, count: int, hip: str | None = None, capability=(9, 0), arch="gfx942:sramecc+:xnack-"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    properties = types.SimpleNamespace(gcnArchName=arch)  # what ROCm's torch reports for an MI300X
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)


def test_no_gpu(monkeypatch, capsys):
    _gpus(monkeypatch, 0)
    assert kernels.gpu_backend() is None and kernels.gpu_target() is None
    monkeypatch.setattr("d2l_ext.guard.gpus_available", lambda n, kind=None: False)
    assert kernels.needs_triton_gpu() is False
    assert capsys.readouterr().out.count("\n") == 1  # one line


@pytest.mark.parametrize(("capability", "target"), [((9, 0), "sm_90"), ((8, 0), "sm_80")])
def test_one_nvidia_gpu(monkeypatch, capability, target):
    _gpus(monkeypatch, 1, capability=capability)
    assert kernels.gpu_backend() == "cuda" and kernels.gpu_target() == target


def test_one_amd_gpu_under_rocm(monkeypatch, capsys):
    _gpus(monkeypatch, 1, hip="6.4.0")
    assert kernels.gpu_backend() == "hip" and kernels.gpu_target() == "gfx942"
    monkeypatch.setattr("d2l_ext.guard.gpus_available", lambda n, kind=None: True)
    assert kernels.needs_triton_gpu() is kernels.triton_importable()


def test_a_gpu_triton_cannot_target_skips_with_one_line(monkeypatch, capsys):
    _gpus(monkeypatch, 0)  # torch.cuda sees nothing, yet another accelerator (MPS, XPU) is usable
    monkeypatch.setattr("d2l_ext.guard.gpus_available", lambda n, kind=None: True)
    monkeypatch.setattr(kernels, "triton_importable", lambda: True)
    assert kernels.needs_triton_gpu() is False
    assert capsys.readouterr().out == ("Skipped: Triton runs on NVIDIA (CUDA) and AMD (ROCm) GPUs; this machine's "
                                       "GPU is neither.\n")


def test_without_triton_kernels_are_defined_and_cells_skip_with_one_line(monkeypatch, capsys):
    from d2l_ext import no_triton as triton  # what the chapter imports where triton is not installed
    from d2l_ext import no_triton_language as tl

    @triton.jit
    def kernel(x_ptr, BLOCK: tl.constexpr):
        return tl.load(x_ptr)

    monkeypatch.setattr(kernels, "triton_importable", lambda: False)  # macOS, native Windows
    assert triton.cdiv(1000, 256) == 4 and kernel.__name__ == "kernel"
    with pytest.raises(AttributeError, match="Triton is not installed here"):
        kernel(0, 4)
    assert kernels.needs_triton() is False
    assert capsys.readouterr().out == kernels.TRITON_SKIP + "\n"


SIMULATED_COPY = """
from d2l_ext import kernels

cuda, numba = kernels.load_simulator()


@cuda.jit
def copy(x, out):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    out[i] = x[i]
"""


@needs_numba
def test_the_simulator_runs_threads_and_names_an_out_of_bounds_thread(monkeypatch, tmp_path):
    if "numba" in sys.modules and not sys.modules["numba"].config.ENABLE_CUDASIM:
        pytest.skip("numba was imported without the simulator in this process")
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    path = tmp_path / "simulated_copy.py"  # the simulator swaps a kernel's global `cuda` for its threads
    path.write_text(SIMULATED_COPY)
    module = kernel_compile.import_file(path)
    x, out = torch.randn(15), torch.zeros(15)
    with pytest.raises(IndexError, match=r"tid=\[15, 0, 0\] ctaid=\[0, 0, 0\]: index 15 is out of bounds"):
        module.copy[1, 16](x.numpy(), out.numpy())
    module.copy[1, 15](x.numpy(), out.numpy())
    assert torch.equal(out, x)


# ---- the chapter's arithmetic ----

def test_occupancy_on_an_h100():
    sm = hardware.SM_LIMITS["H100"]
    assert kernels.occupancy(32, 0, 4, sm) == kernels.Occupancy(16, 64, "warps", 1.0)
    assert kernels.occupancy(33, 0, 4, sm).warps == 48  # 33 registers are allocated as 40
    assert kernels.occupancy(107, 98304, 8, sm) == kernels.Occupancy(2, 16, "registers", 0.25)
    assert kernels.occupancy(106, 131072, 8, sm) == kernels.Occupancy(1, 8, "shared memory", 0.125)


def test_the_sm_limits_have_sources():
    h100, a100 = hardware.SM_LIMITS["H100"], hardware.SM_LIMITS["A100"]
    assert (h100.registers, h100.shared, h100.max_warps, h100.sms) == (65536, 228 * 1024, 64, 132)
    assert a100.shared == 164 * 1024 and a100.sms == 108
    assert all("CUDA C++ Programming Guide" in sm.source for sm in (h100, a100))


def test_softmax_bytes_fused_and_three_kernels():
    found = kernels.unfused_softmax_bytes(64, 200)
    n, rows = 64 * 200, 64
    assert found["fused"] == 2 * n * 4
    assert found["unfused"] == (5 * n + 4 * rows) * 4 == 257024


@pytest.mark.parametrize("draw", ["draw_grid", "draw_tiles", "draw_access", "draw_pipeline"])
def test_each_picture_draws(draw):
    import matplotlib.pyplot as plt

    figure = getattr(diagrams_kernels, draw)()
    assert figure.axes and any(axis.patches for axis in figure.axes)
    plt.close(figure)


def test_the_access_picture_counts_sectors():
    import matplotlib.pyplot as plt

    figure = diagrams_kernels.draw_access(lanes=8, stride=4)
    titles = [axis.get_title() for axis in figure.axes]
    plt.close(figure)
    assert titles[0].endswith("8 floats used, 1 of 4 32-byte sectors touched")
    assert titles[1].endswith("8 floats used, 4 of 4 32-byte sectors touched")


def test_a_kernel_for_the_gpu_refuses_cpu_tensors():
    def add(x_ptr, out_ptr, n, BLOCK):
        pass

    compiled = types.SimpleNamespace(fn=add)  # a JITFunction, as far as launch looks: not interpreted
    with pytest.raises(ValueError, match=r"x_ptr is on cpu, the kernel runs on cuda: move it with .to\('cuda'\)"):
        kernels.launch(compiled, (1,), torch.randn(4), torch.randn(4), 4, BLOCK=4)


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure without a GPU")
def test_the_gpu_run_fails_with_the_childs_error_without_a_gpu(monkeypatch):
    from d2l_ext import kernel_gpu

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the child must compile, not interpret, and still fail here
    add = ADD.strip()
    with pytest.raises(RuntimeError, match="the GPU run failed") as caught:
        kernel_gpu.time_on_gpu(add, add.replace("add_kernel", "matmul_kernel"))
    assert "Error" in str(caught.value)


@pytest.mark.parametrize(("mma", "family"), [
    (["wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"], "wgmma"),  # triton 3.8.0, sm_90
    (["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"], "mma.sync"),  # sm_80
    (["v_mfma_f32_32x32x8_f16"], "MFMA"),  # gfx942
    ([], "none"),
])
def test_the_matrix_instruction_family(mma, family):
    assert kernel_compile.Facts("sm_90", mma=mma).mma_family() == family

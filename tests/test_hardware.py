"""d2l_ext.hardware: the figures of the sources, each with what it measures; GPUs matched by model, never by part."""

from __future__ import annotations

import pytest

from d2l_ext import hardware, roofline

# What torch.cuda.get_device_name() returns, and the row it must get. The names are those NVIDIA's and AMD's
# drivers report (nvidia-smi, bandwidthTest and rocm-smi output quoted in the course and its sources); a model
# whose figures no source confirmed has no row (None), whatever model its name contains.
DEVICE_NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100"),  # the SXM5
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GH200 480GB", None),
    ("NVIDIA B200", None),
    ("Tesla T4", "T4"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300A", None),
    ("AMD Instinct MI325X", None),
    ("Apple M2", None),
    ("NVIDIA GeForce RTX 4090", None),
    ("NVIDIA A10G", None),
    ("Tesla V100-SXM2-16GB", None),
    ("", None),
]


@pytest.mark.parametrize(("device_name", "row"), DEVICE_NAMES)
def test_a_device_name_gets_its_own_models_row_or_none(device_name, row):
    spec = hardware.lookup(device_name)
    assert (spec.name if spec else None) == row


def test_the_variants_differ_where_their_sheets_do():
    def lookup(device_name: str) -> hardware.GPUSpec:
        spec = hardware.lookup(device_name)
        assert spec is not None, device_name
        return spec

    assert lookup("NVIDIA A100-SXM4-40GB").bandwidth == 1555e9  # not the 80 GB's 2,039
    assert lookup("NVIDIA A100 80GB PCIe").bandwidth == 1935e9
    assert lookup("NVIDIA H100 PCIe").peak["bfloat16"] == 756.5e12  # 1,513 with sparsity, not the SXM5's 989.4
    assert lookup("NVIDIA H200").peak == lookup("NVIDIA H100 80GB HBM3").peak  # the same die, faster memory
    assert (lookup("NVIDIA H200").bandwidth, lookup("NVIDIA H200").memory_gib) == (4.8e12, 141)


def test_an_unknown_gpu_gets_one_line_naming_it():
    message = hardware.no_row_message("NVIDIA B200")
    assert message.startswith("NVIDIA B200: no recorded figure") and "\n" not in message


def test_the_course_rows_keep_the_reviewed_values():
    # ../shared/reviews/gpu-paths-2026-11-29.md section 4: the four rows checked against the vendors' sheets
    assert list(roofline.GPUS) == ["T4", "A100", "H100", "MI300X"]
    reviewed = {"T4": ({"float32": 8.1e12, "float16": 65e12}, 320e9, 16),
                "A100": ({"float32": 19.5e12, "tf32": 156e12, "float16": 312e12, "bfloat16": 312e12}, 2039e9, 80),
                "H100": ({"float32": 67e12, "tf32": 494.7e12, "float16": 989.4e12, "bfloat16": 989.4e12}, 3.35e12,
                         80),
                "MI300X": ({"float32": 163.4e12, "tf32": 653.7e12, "float16": 1307.4e12, "bfloat16": 1307.4e12},
                           5.3e12, 192)}
    for name, (peak, bandwidth, memory) in reviewed.items():
        spec = roofline.gpu_spec(name)
        assert (spec.peak, spec.bandwidth, spec.memory_gib) == (peak, bandwidth, memory)
    assert roofline.peak_flops("H100", "bfloat16") == 989.4e12
    assert roofline.peak_flops("H100 PCIe", "float32") == 51e12  # roofline reads every row


def test_every_figure_has_a_unit_what_it_measures_and_a_source():
    models = [*hardware.SPECS, *hardware.RECORDED]
    for model in models:
        for figure in hardware.figures(model):
            assert figure.value > 0 and figure.unit and figure.source
            assert figure.measures.split(":")[0] in ("spec", "measured", "the cluster of that run")


def test_links_and_sparsity_say_which_direction_and_which_count():
    h100 = {(f.value, f.measures) for f in hardware.figures("H100") if f.unit == "GB/s"}
    assert (450, "spec: NVLink 4, one direction") in h100 and (900, "spec: NVLink 4, both directions") in h100
    assert (64, "spec: PCIe Gen5 x16 to the host, one direction") in h100
    tflops = {round(f.value, 1): f.measures for f in hardware.figures("H100") if f.unit == "TFLOP/s"}
    assert tflops[989.4] == "spec: dense float16 peak" or tflops[989.4] == "spec: dense bfloat16 peak"
    assert tflops[1978.8].endswith("with sparsity")
    assert not any("sparsity" in f.measures for f in hardware.figures("T4"))  # the T4's sheet has none


def test_the_recorded_measurements_are_the_sources_figures():
    def values(model: str, unit: str) -> set[float]:
        return {f.value for f in hardware.RECORDED[model] if f.unit == unit}

    assert values("H100", "GB/s") == {370, 480, 380}  # nccl-tests#212 (rings, NVLS), nccl#1264 one direction
    assert 783 not in values("H100", "GB/s")  # nccl#1264's two-direction copy is not a busbw
    assert values("H100", "TFLOP/s") | values("A100", "TFLOP/s") | values("MI300X", "TFLOP/s") == {
        794.5, 271.2, 668.4, 740}  # MAMF (three), FlashAttention-3's FP16 forward on an H100 (chapter 12)
    assert values("V100", "PFLOP/s") == {15.1} and values("V100", "GPUs") == {512} and values("V100", "%") == {76}
    assert values("H100", "%") == {38, 50}  # picotron's MFU on 64 and on 8 H100s
    assert "740 TFLOPs/s (75% utilization)" in hardware.recorded("H100", "FlashAttention-3").source
    # bandwidthTest's host copies, 32 MB: chapter 3 quotes them; pinned is faster than pageable on every host
    assert values("T4", "GB/s") == {9.7, 11.1} and {9.6, 11.4} <= values("V100", "GB/s")
    copies = {f.measures.split(",")[0]: f.value for f in hardware.RECORDED["A100 PCIe 80GB"]}
    assert copies == {"measured: h2d pageable copy": 3.3, "measured: h2d pinned copy": 17.3,
                      "measured: d2h pageable copy": 8.5, "measured: d2h pinned copy": 24.6}


@pytest.mark.parametrize(("call", "message"), [
    (lambda: hardware.gpu_spec("B200"), "T4, A100, H100, MI300X"),
    (lambda: hardware.figures("B200"), "no figure recorded for 'B200'"),
])
def test_unknown_names_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_measured_peak_is_compared_with_its_own_models_sheet_or_not_at_all():
    assert hardware.against_sheet("NVIDIA H100 PCIe", "bfloat16", 605.2e12) == (
        "NVIDIA H100 PCIe: 80% of its spec sheet's 756 TFLOP/s (H100 PCIe 80 GB, dense)")  # not the SXM5's 989
    assert hardware.against_sheet("NVIDIA H100 80GB HBM3", "bfloat16", 791.5e12).startswith(
        "NVIDIA H100 80GB HBM3: 80% of its spec sheet's 989 TFLOP/s")
    assert hardware.against_sheet("NVIDIA H100 NVL", "bfloat16", 1e15) == hardware.no_row_message("NVIDIA H100 NVL")
    assert hardware.against_sheet("Tesla T4", "bfloat16", 1e12).startswith("Tesla T4: no recorded bfloat16 peak")


def test_a_recorded_figure_is_found_by_what_it_measures():
    assert hardware.recorded("H100", "MAMF").value == 794.5
    assert hardware.recorded("H100", "rings").value == 370
    with pytest.raises(ValueError, match="2 recorded figures of 'H100' say 'busbw'"):
        hardware.recorded("H100", "busbw")

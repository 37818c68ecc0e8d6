"""tools/envs/venvs.py: a new environment hard-links what does not depend on its Python, and only that."""

from __future__ import annotations

import os
from pathlib import Path

from tools.envs import venvs

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only


def install(site: Path, name: str, tag: str, files: dict[str, bytes], outside: str | None = None) -> Path:
    """A fake installed package: its files, and a dist-info with WHEEL and RECORD (as pip writes them)."""
    dist_info = site / f"{name}-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "WHEEL").write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
    for relative, data in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_bytes(data)
    record = [f"{relative},sha256=x,{len(data)}" for relative, data in files.items()]
    record += [f"{name}-1.0.dist-info/WHEEL,,", f"{name}-1.0.dist-info/RECORD,,"]
    if outside:
        record.append(f"{outside},,")
    (dist_info / "RECORD").write_text("\n".join(record) + "\n")
    return dist_info


def test_only_python_independent_packages_without_scripts_are_seeded(tmp_path):
    source, target = tmp_path / "a", tmp_path / "b"
    target.mkdir()
    info = install(source, "nvidia_cublas", "py3-none-manylinux_2_27_x86_64",
                   {"nvidia/cublas/lib/libcublas.so": b"x" * 10})
    install(source, "torch", "cp311-cp311-manylinux_2_28_x86_64", {"torch/lib/libtorch_cpu.so": b"t"})
    install(source, "six", "py2.py3-none-any", {"six.py": b"s"})  # pure Python: pip decides per Python
    install(source, "ruff", "py3-none-manylinux_2_17_x86_64", {"ruff/__init__.py": b"r"}, outside="../../../bin/ruff")
    linked = venvs.seed(source, target)
    assert linked == 10 + sum(f.stat().st_size for f in info.iterdir())  # the library and its dist-info
    assert os.path.samefile(target / "nvidia/cublas/lib/libcublas.so", source / "nvidia/cublas/lib/libcublas.so")
    assert (target / "nvidia_cublas-1.0.dist-info" / "RECORD").exists()  # pip sees it installed
    assert not (target / "torch").exists() and not (target / "six.py").exists() and not (target / "ruff").exists()
    assert venvs.seed(source, target) == 0  # what is there already is left alone


def test_dedupe_links_only_files_equal_byte_for_byte(tmp_path):
    source, target = tmp_path / "a", tmp_path / "b"
    for folder, tail in ((source, b"A"), (target, b"B")):
        (folder / "lib").mkdir(parents=True)
        (folder / "lib" / "same.so").write_bytes(b"0" * 4096)
        (folder / "lib" / "other.so").write_bytes(b"0" * 4095 + tail)  # same size, one byte differs
        (folder / "lib" / "small.so").write_bytes(b"1")
    saved = venvs.dedupe(source, target, smallest=1024)
    assert saved == 4096
    assert os.path.samefile(target / "lib" / "same.so", source / "lib" / "same.so")
    assert not os.path.samefile(target / "lib" / "other.so", source / "lib" / "other.so")
    assert (target / "lib" / "other.so").read_bytes().endswith(b"B")
    assert not os.path.samefile(target / "lib" / "small.so", source / "lib" / "small.so")  # below `smallest`
    assert venvs.dedupe(source, target, smallest=1024) == 0


def test_free_gib_reads_the_nearest_existing_folder(tmp_path):
    assert venvs.free_gib(tmp_path / "not" / "made" / "yet") > 0

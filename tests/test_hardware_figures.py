"""A hardware figure in a notebook's text agrees with d2l_ext.hardware, the table of the figures the course quotes.

Each markdown cell of the English notebooks and solutions is cut into sentences (a table row, a bullet and a
paragraph's sentences each count), and each sentence into clauses at ", " and "; ". A number with a unit
(TFLOP/s, PFLOP/s, GB/s, TB/s, GB; "783 of 900 GB/s" gives both numbers the unit) in a clause that names a GPU
model (T4, V100, A100, H100, H200, MI300X, B200 ...) must be one of that model's figures in that unit, at the
precision printed (989 for 989.4; 1,979 for 1,978.8 with sparsity). A family name covers its variants: "A100"
accepts the figures of every A100 row. A clause that names no model is not checked: "PCIe 3.0 x16 carries 15.8
GB/s per direction, a T4's memory 320 GB/s" checks only 320 against the T4.

Not checked: a conversion in parentheses ("15,360 MiB (16.1 GB)", the same quantity in another unit), and any
sentence marked with the HTML comment ``<!-- figure: computed -->`` (or ``<!-- figure: ... -->`` with another
reason): a result the chapter computes, or a figure of something other than the GPU named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from d2l_ext import hardware

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))

SCALE = {"TFLOP/s": 1e12, "PFLOP/s": 1e15, "GB/s": 1e9, "TB/s": 1e12, "GB": 1e9}
KIND = {"TFLOP/s": "FLOP/s", "PFLOP/s": "FLOP/s", "GB/s": "B/s", "TB/s": "B/s", "GB": "B"}
SPELLINGS = {"TFLOPS": "TFLOP/s", "PFLOPS": "PFLOP/s"}
# models whose names the text may use; those with no figure in the table fail on any figure quoted for them
MODEL = re.compile(r"(?<![\w-])(T4|V100|A100|H100|H200|GH200|B100|B200|GB200|MI250X?|MI300[AX]|MI325X|MI355X)s?"
                   r"(?![\w-])")
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = r"TFLOP/s|TFLOPS|PFLOP/s|PFLOPS|GB/s|TB/s|GB"
QUOTED = re.compile(rf"(?<![\w.,])({NUMBER})\s*({UNIT})(?![\w/])")
PAIRED = re.compile(rf"(?<![\w.,])({NUMBER})\s+(?:of|to)\s+(?:its\s+|about\s+|the\s+)?({NUMBER})\s*({UNIT})(?![\w/])")
CONVERSION = re.compile(rf"({NUMBER})\s*(MiB|GiB)\s*\(({NUMBER})\s*GB\)")
MARKER = "<!-- figure:"


Table = dict[str, list[tuple[str, list[hardware.Figure]]]]
QUALIFIERS = re.compile(r"\b(PCIe|SXM|NVL|40 ?GB|80 ?GB)(?![A-Za-z])", re.I)


def families() -> Table:
    """The table's rows by family name (a row's first word): (model, its figures) for each row of the family."""
    found: Table = {}
    for key in dict.fromkeys([*hardware.SPECS, *hardware.RECORDED]):
        model = hardware.SPECS[key].model if key in hardware.SPECS else key
        found.setdefault(key.split()[0], []).append((model, hardware.figures(key)))
    return found


def rows_meant(clause: str, rows: list[tuple[str, list[hardware.Figure]]]) -> list[hardware.Figure]:
    """The figures of the rows a clause means: every row of the family, or those its words name (PCIe, SXM,
    NVL, 40 GB, 80 GB: "an A100 40 GB" means the two 40 GB rows, "an H100 NVL" none)."""
    words = {q.group(1).upper().replace(" ", "") for q in QUALIFIERS.finditer(clause)}
    return [f for model, figures in rows if all(word in model.upper().replace(" GB", "GB") for word in words)
            for f in figures]


def sentences(text: str) -> list[str]:
    """A markdown cell's sentences: table rows and list items on their own, paragraphs cut after . ! ? and :."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:[*+-]|\d+\.|\|)\s)|\n(?=#)", text)
    found = []
    for block in blocks:
        block = re.sub(r"<(?!!--)[^>]*>", " ", block)  # HTML tags, not the comments that mark a sentence
        found += [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[])", " ".join(block.split())) if s.strip()]
    return found


def close(quoted: str, figure_value: float) -> bool:
    """True if ``quoted`` (as printed, "1,979") is ``figure_value`` at the precision printed."""
    digits = quoted.replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return abs(float(digits) - figure_value) <= 0.5 * 10**-decimals + 1e-9


def quoted_figures(clause: str) -> list[tuple[str, str]]:
    """(number as printed, unit) for each figure the clause quotes, less the conversions in parentheses."""
    conversions = {m.group(3) for m in CONVERSION.finditer(clause)
                   if close(m.group(3), float(m.group(1).replace(",", "")) * (2**20 if m.group(2) == "MiB" else 2**30)
                            / 1e9)}
    found = [(m.group(i), m.group(3)) for m in PAIRED.finditer(clause) for i in (1, 2)]
    found += [(m.group(1), m.group(2)) for m in QUOTED.finditer(clause)]
    return sorted({(number, SPELLINGS.get(unit, unit)) for number, unit in found if number not in conversions})


def problems(text: str, table: Table | None = None) -> list[str]:
    """Each figure of ``text`` that names a model and disagrees with the table: "sentence: number unit, model"."""
    table = families() if table is None else table
    found = []
    for sentence in sentences(text):
        if MARKER in sentence:
            continue
        for clause in re.split(r"[,;] ", sentence):
            models = sorted({m.group(1) for m in MODEL.finditer(clause)})
            for model in models:
                figures = rows_meant(clause, table.get(model, []))
                for number, unit in quoted_figures(clause):
                    same = [f.value * SCALE[f.unit] / SCALE[unit] for f in figures
                            if f.unit in KIND and KIND[f.unit] == KIND[unit]]
                    if not any(close(number, value) for value in same):
                        known = ", ".join(f"{value:g}" for value in sorted(set(same))) or "none"
                        found.append(f"{sentence!r}: {number} {unit} is not a figure of the {model} in "
                                     f"d2l_ext.hardware (its figures in {unit}: {known})")
    return found


def test_figures_that_agree_pass_and_figures_that_do_not_fail():
    good = [
        "A tensor on a GPU uses far less memory than a host's (16 GB on a T4, 80 GB on an H100).",
        "**Cost.** PCIe 3.0 x16 carries 15.8 GB/s per direction (PCIe specification), a T4's memory 320 GB/s.",
        "The largest matrix product an H100 SXM reaches is about 794.5 of its 989 TFLOP/s in bfloat16 (80%).",
        "Specified peaks: NVLink 4 (H100) 450 GB/s per direction, PCIe 4.0 x16 31.5 GB/s.",
        "Megatron-LM trained an 8.3-billion-parameter model on 512 V100 GPUs at 15.1 PFLOP/s, 76% scaling.",
        "An H100 SXM's sheet says 1,979 TFLOP/s in bfloat16 with sparsity, an H100 PCIe's 1,513 TFLOP/s.",
        "Colab's T4 has 15,360 MiB (16.1 GB).",
        "On 8 H100s nccl-tests' all-reduce busbw is about 370 GB/s with rings and 480 GB/s with NVLS.",
        "An A100 40 GB reads 1,555 GB/s, an A100 SXM 80 GB 2.04 TB/s.",
        "An H100 would do it in 2 ms at 900 TFLOP/s. <!-- figure: computed -->",
    ]
    assert [problems(text) for text in good] == [[] for _ in good]
    bad = {
        "NVLink carries hundreds of GB/s; one user measured 783 of 900 GB/s busbw on an HGX H100.": "783 GB/s",
        "* **HBM** on an H100: 80 GB at 3.5 TB/s;": "3.5 TB/s",
        "Megatron-LM reached 15.2 PFLOP/s on 512 V100 GPUs.": "15.2 PFLOP/s",
        "| NVIDIA A100 40GB PCIe | 1,935 GB/s |": "1,935 GB/s",
        "A T4 does 65 TFLOP/s in float16 and 16 TFLOP/s in float32.": "16 TFLOP/s",
        "A B200 reaches 2,250 TFLOP/s in bfloat16.": "2,250 TFLOP/s",
        "An MI300X holds 128 GB.": "128 GB",
    }
    for text, figure in bad.items():
        found = problems(text)
        assert len(found) == 1 and f": {figure} is not a figure" in found[0], (text, found)


def notebook_problems(path: Path, table: Table | None = None) -> list[str]:
    """Each disagreeing figure of a notebook's markdown cells: "notebook cell ID: 'sentence': why"."""
    table = families() if table is None else table
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} cell {cell.get('id')}: {problem}"
            for cell in cells if cell["cell_type"] == "markdown"
            for problem in problems("".join(cell["source"]), table)]


def test_a_failure_names_the_notebook_the_cell_and_the_sentence(tmp_path):
    sentence = "One user measured 783 of 900 GB/s busbw on an HGX H100 (NVIDIA/nccl issue 1264)."
    cells = [{"cell_type": "markdown", "id": "md-right", "source": ["An H100 reads 3.35 TB/s."]},
             {"cell_type": "code", "id": "code", "source": ["# an H100 does 1 TFLOP/s in a comment: not text"]},
             {"cell_type": "markdown", "id": "md-busbw", "source": ["NVLink carries hundreds of GB/s.\n", sentence]}]
    path = tmp_path / "10_how_fast.ipynb"
    path.write_text(json.dumps({"cells": cells}), encoding="utf-8")
    [found] = notebook_problems(path)
    assert found.startswith(f"{path} cell md-busbw: {sentence!r}: 783 GB/s is not a figure of the H100 in "
                            "d2l_ext.hardware (its figures in GB/s: ")
    assert ", 450, " in found and ", 900, " in found  # the link's one-direction and two-direction figures


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: str(path.relative_to(ROOT / "notebooks")))
def test_every_hardware_figure_in_the_text_is_the_tables(path):
    found = notebook_problems(path)
    assert not found, "\n".join(found)

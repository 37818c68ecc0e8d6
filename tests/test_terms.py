"""The editions' terminology: one word per term, as chosen in editions/terms/{language}.json (kernel-free).

Each term file holds, per language, the chosen term of each entry and the variants it replaces (Python regular
expressions). A variant found in the prose of a markdown cell of that edition fails the test, which names the
notebook, the cell and the words. Prose is the markdown without fenced code, code spans, math, link targets, URLs
and HTML tags (a code span becomes `c` and math $m$, so that the Chinese spacing rule still sees where they are).

The loader refuses a term file that cannot work: an entry without a term or variants, a variant that is not a
regular expression, and a variant that equals its chosen term or matches it (it would flag the right word).
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import nbformat
import pytest

from tools.book import editions

TERMS = editions.EDITIONS / "terms"


def load_terms(path: Path) -> dict:
    """Return a term file, checked: each entry has a term and variants, and no variant flags its own term."""
    data = json.loads(path.read_text(encoding="utf-8"))
    for number, entry in enumerate(data["terms"]):
        name = f"{path.name} entry {number} ({entry.get('english', '?')})"
        if not entry.get("term") or not entry.get("variants"):
            raise ValueError(f"{name}: needs a term and at least one variant")
        for variant in entry["variants"] + entry.get("allow", []) + [entry.get("first_mention_of", "")]:
            try:
                re.compile(variant)
            except re.error as err:
                raise ValueError(f"{name}: {variant!r} is not a regular expression ({err})") from None
        for variant in entry["variants"]:
            if variant == entry["term"] or re.search(variant, entry["term"]):
                raise ValueError(f"{name}: the variant {variant!r} is the chosen term {entry['term']!r} itself")
    return data


def prose(markdown: str) -> str:
    """Return the prose of a markdown cell: fenced code, link targets, URLs and HTML tags left out; code spans and
    math kept as placeholders."""
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", " ", markdown)
    text = re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", "`c`", text, flags=re.S)
    text = re.sub(r"\$\$.+?\$\$", "$m$", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", "$m$", text)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    text = re.sub(r"https?://\S+", "", text)
    return re.sub(r"<[^>\n]+>", "", text)


def applies(entry: dict, notebook: str) -> bool:
    return not entry.get("only") or any(fnmatch.fnmatch(notebook, pattern) for pattern in entry["only"])


def found_variants(entry: dict, cells: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Return (cell id, words) for each variant of ``entry`` in ``cells`` ((cell id, prose) in order)."""
    found = []
    if entry.get("first_mention_of"):  # only the first mention in the notebook is checked
        for cell_id, text in cells:
            first = re.search(entry["first_mention_of"], text)
            if first:
                if any(re.compile(variant).match(text, first.start()) for variant in entry["variants"]):
                    found.append((cell_id, text[max(0, first.start() - 8):first.end()]))
                break
        return found
    for cell_id, text in cells:
        allowed = [m.span() for pattern in entry.get("allow", []) for m in re.finditer(pattern, text)]
        for variant in entry["variants"]:
            for m in re.finditer(variant, text):
                if not any(a <= m.start() and m.end() <= b for a, b in allowed):
                    found.append((cell_id, text[max(0, m.start() - 8):m.end() + 8].replace("\n", " ")))
    return found


def term_problems(language: str, data: dict, root: Path) -> list[str]:
    """Return one line per variant found in the edition under ``root`` (notebook, cell, words, chosen term)."""
    lines = []
    for path in sorted(root.rglob("*.ipynb")):
        notebook = path.relative_to(root).as_posix()
        if notebook in data.get("not_yet", {}) or ".ipynb_checkpoints" in notebook:
            continue
        cells = [(c.id, prose(c.source)) for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]
        for entry in data["terms"]:
            if applies(entry, notebook):
                for cell_id, words in found_variants(entry, cells):
                    lines.append(f"editions/{language}/{notebook} cell {cell_id}: {words!r}: write "
                                 f"{entry['term']!r} ({entry['english']})")
    return lines


@pytest.mark.parametrize("language", list(editions.LANGUAGES))
def test_each_edition_uses_its_chosen_terms(language):
    data = load_terms(TERMS / f"{language}.json")
    assert data["language"] == language
    found = term_problems(language, data, editions.EDITIONS / language)
    assert found == [], f"{len(found)} variants, the first: " + "\n".join(found[:10])


def test_the_review_choices_are_seeded():
    chosen = {language: {e["term"] for e in load_terms(TERMS / f"{language}.json")["terms"]}
              for language in editions.LANGUAGES}
    assert {"chia mảnh; mảnh (shard)", "bộ nhớ phân trang", "dự trữ", "luồng CUDA mặc định", "đồ thị CUDA",
            "khởi động lại kernel của Jupyter", "kích thước", "lõi Tensor", "checkpoint kích hoạt", "ta kỳ vọng",
            "ta", "65536"} <= chosen["vi"]
    assert {"工作单元", "在GPU上运行时的输出", "轮", "保留", "准确率", "Jupyter笔记本", "环形全归约", "锁页内存",
            "预计", "第3.5节", "在GPU上"} <= chosen["zh-CN"]


def notebook_with(tmp_path: Path, language: str, name: str, text: str) -> Path:
    """An edition folder in tmp_path holding one notebook with one markdown cell."""
    path = tmp_path / language / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text, id="planted")]), path)
    return tmp_path / language


@pytest.mark.parametrize(("language", "name", "text", "words"), [
    ("vi", "06_multi_gpu.ipynb", "ZeRO phân mảnh trạng thái của bộ tối ưu.", "phân mảnh"),
    ("vi", "03_copying.ipynb", "Từ bộ nhớ pageable, `pageable` thì chậm.", "pageable"),
    ("vi", "06_multi_gpu.ipynb", "Chúng ta dùng 65,536 mẫu.", "Chúng ta"),
    ("zh-CN", "03_copying.ipynb", "我们在 GPU 上复制。", "在 GPU"),
    ("zh-CN", "solutions/06_multi_gpu.ipynb", "## 练习2：CPU上的四个工作进程", "工作进程"),
    ("zh-CN", "01_devices.ipynb", "本笔记本使用的设备。", "本笔记本"),
])
def test_a_planted_variant_fails_and_is_named(tmp_path, language, name, text, words):
    data = load_terms(TERMS / f"{language}.json")
    found = term_problems(language, data, notebook_with(tmp_path, language, name, text))
    assert found and all(line.startswith(f"editions/{language}/{name} cell planted: ") for line in found)
    assert any(words in line for line in found), found


@pytest.mark.parametrize(("language", "name", "text"), [
    ("vi", "02_tensors_on_gpu.ipynb", "Bộ nhớ bị phân mảnh: xem [phân mảnh bộ nhớ](glossary.md#bộ-nhớ)."),
    ("vi", "03_copying.ipynb", "Bộ nhớ phân trang (pageable) và `pin_memory(pageable)`; 0.73 và 16.8 MB."),
    ("vi", "04_async_and_gil.ipynb", "Ta kỳ vọng đồ thị CUDA (CUDA graph) nhanh hơn. Lõi Tensor thì khác."),
    ("zh-CN", "03_copying.ipynb", "## 3.1 复制张量\n\n在GPU上，`x`的大小是4字节（第3.5节），元素个数 x 字节数。"),
    ("zh-CN", "05b_training_fast.ipynb", "DataLoader的工作进程；本Jupyter笔记本，之后是笔记本和笔记本电脑。"),
])
def test_the_chosen_terms_pass(tmp_path, language, name, text):
    data = load_terms(TERMS / f"{language}.json")
    assert term_problems(language, data, notebook_with(tmp_path, language, name, text)) == []


@pytest.mark.parametrize(("entry", "message"), [
    ({"english": "reserved", "term": "dự trữ", "variants": ["dự trữ"]}, "is the chosen term 'dự trữ' itself"),
    ({"english": "stream", "term": "luồng CUDA", "variants": ["luồng"]}, "is the chosen term 'luồng CUDA' itself"),
    ({"english": "epoch", "term": "轮", "variants": ["迭代周期("]}, "is not a regular expression"),
    ({"english": "epoch", "term": "轮", "variants": []}, "needs a term and at least one variant"),
])
def test_a_term_file_whose_variant_is_its_term_is_refused(tmp_path, entry, message):
    path = tmp_path / "xx.json"
    path.write_text(json.dumps({"language": "xx", "terms": [entry]}), encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"xx.json entry 0 ({entry['english']}): ") + ".*"
                       + re.escape(message)):
        load_terms(path)

"""The editions' terminology: one word per term, as chosen in editions/terms/{language}.json (kernel-free).

Each term file holds, per language, the chosen term of each entry and the variants it replaces (Python regular
expressions). A variant found in the prose of a markdown cell of that edition fails the test, which names the
notebook, the cell and the words. Prose is the markdown without fenced code, code spans, math, link targets, URLs
and HTML tags (a code span becomes `c` and math $m$, so that the Chinese spacing rule still sees where they are).
An entry with ``"comments": true`` also reads the code cells' comments (their text after ``#``): the style rules
(Chinese spacing, Vietnamese thousands separators) hold there too.

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
        notebook_cells = nbformat.read(path, as_version=4).cells
        cells = [(c.id, prose(c.source)) for c in notebook_cells if c.cell_type == "markdown"]
        code = [(c.id, "\n".join(line.lstrip("#").strip() for line in editions.comments(c.source)))
                for c in notebook_cells if c.cell_type == "code"]
        for entry in data["terms"]:
            if applies(entry, notebook):
                for cell_id, words in found_variants(entry, cells + code if entry.get("comments") else cells):
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
            "ta", "65536", "truyền thông", "cơ chế chú ý", "tác nhân", "phép toán tập thể không khớp",
            "Số liệu đã ghi nhận", "bộ đa xử lý", "giá trị kích hoạt"} <= chosen["vi"]
    assert {"工作单元", "在GPU上运行时的输出", "轮", "保留", "准确率", "Jupyter笔记本", "环形全归约", "锁页内存",
            "预计", "第3.5节", "在GPU上", "张量核", "核函数", "多层感知机", "全归约", "隐藏单元数", "激活值",
            "**延伸阅读**：", "已发表的数据", "| 节 | 仅CPU | 单个GPU | 多个GPU |"} <= chosen["zh-CN"]


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
    # the review of 2026-11-29: one word per concept, book-wide
    ("vi", "06_multi_gpu.ipynb", "Các tiến trình giao tiếp qua socket.", "giao tiếp"),
    ("vi", "10_how_fast.ipynb", "## 10.5 Chi phí truyền dữ liệu", "truyền dữ liệu"),
    ("vi", "10_how_fast.ipynb", "Ở đây attention được viết ra từng bước.", "attention"),
    ("vi", "11_survive.ipynb", "Hai tác tử `torchrun` đóng vai hai máy.", "tác tử"),
    ("vi", "11_survive.ipynb", "dưới một dạng khác, một collective không khớp.", "collective không khớp"),
    ("vi", "09_model_parallel.ipynb", "song song dữ liệu trải qua các máy.", "trải qua các máy"),
    ("vi", "09_model_parallel.ipynb", "**Số liệu đã công bố** (không đo ở đây):", "Số liệu đã công bố"),
    ("vi", "10_how_fast.ipynb", "các **bộ đa xử lý luồng** (SM)", "bộ đa xử lý luồng"),
    ("vi", "10_how_fast.ipynb", "gradient ghi một lần, kích hoạt ghi và đọc một lần", "kích hoạt"),
    ("vi", "03_copying.ipynb", "| Phần | Chỉ có CPU | Một GPU |\n|---|---|---|", "Phần"),
    ("vi", "10_how_fast.ipynb", "| 10.5 | 2 tiến trình CPU | như vậy |", "như vậy"),
    ("zh-CN", "10_how_fast.ipynb", "它的**张量核心**（Tensor Core）", "张量核心"),
    ("zh-CN", "10_how_fast.ipynb", "这一步约20个内核中的每一个", "内核"),
    ("zh-CN", "10_how_fast.ipynb", "第5章的MLP每步约做57 MFLOP。", "MLP"),
    ("zh-CN", "10_how_fast.ipynb", "反向传播才能掩盖梯度的all-reduce？", "all-reduce"),
    ("zh-CN", "06_multi_gpu.ipynb", "对隐藏层大小64、256和1024", "隐藏层大小"),
    ("zh-CN", "10_how_fast.ipynb", "对隐藏宽度为28,672的多层感知机", "隐藏宽度"),
    ("zh-CN", "10_how_fast.ipynb", "梯度写一次，激活写一次、读一次", "激活写"),
    ("zh-CN", "10_how_fast.ipynb", "**延伸阅读：** PyTorch的文档", "延伸阅读："),
    ("zh-CN", "11_survive.ipynb", "**硬件：** 全部只用CPU", "硬件："),
    ("zh-CN", "10_how_fast.ipynb", "**已记录的数字**（非本机测量）：", "已记录的数字"),
    ("zh-CN", "01_devices.ipynb", "| 小节 | 仅有CPU | 一块GPU |\n|---|---|---|", "小节"),
    ("zh-CN", "05_networks_on_gpu.ipynb", "| 节 | 仅CPU | 一个GPU |\n|---|---|---|", "一个GPU"),
    # chapter 12 (issue 46): the terms of the glossary's Writing kernels group
    ("vi", "12_kernels.ipynb", "Các luồng của một khối ghi vào bộ nhớ chia sẻ.", "bộ nhớ chia sẻ"),
    ("vi", "12_kernels.ipynb", "`cuda.syncthreads()` chính là rào đồng bộ đó.", "rào đồng bộ"),
    ("vi", "12_kernels.ipynb", "Đó là đường ống phần mềm.", "đường ống phần mềm"),
    ("vi", "12_kernels.ipynb", "Các luồng của một warp có truy cập hợp nhất.", "truy cập hợp nhất"),
    ("vi", "12_kernels.ipynb", "Mỗi chương trình xử lý một tile của $C$.", "tile"),
    ("vi", "12_kernels.ipynb", "Thanh ghi quyết định occupancy của nó.", "occupancy"),
    ("zh-CN", "12_kernels.ipynb", "`cuda.syncthreads()`就是这道同步屏障。", "同步屏障"),
    ("zh-CN", "12_kernels.ipynb", "跨步读取不是合并访存。", "合并访存"),
    ("zh-CN", "12_kernels.ipynb", "一个warp等待内存时，另一个计算。", "warp"),
    ("zh-CN", "12_kernels.ipynb", "这就是核融合。", "核融合"),
    ("zh-CN", "12_kernels.ipynb", "寄存器和共享内存决定了占有率。", "占有率"),
    # chapter 13 (issue 47): the terms of the glossary's Serving group
    ("vi", "13_serving.ipynb", "Không có bộ nhớ đệm, mỗi bước chạy lại cả chuỗi: đó là KV cache.", "KV cache"),
    ("vi", "13_serving.ipynb", "Mô hình dùng chú ý truy vấn nhóm.", "chú ý truy vấn nhóm"),
    ("vi", "13_serving.ipynb", "Bước prefill đọc lời nhắc.", "prefill"),
    ("vi", "13_serving.ipynb", "Bảng block của mỗi yêu cầu liệt kê các khối.", "Bảng block"),
    ("vi", "13_serving.ipynb", "Gộp lô liên tục nhận yêu cầu ở mọi bước.", "Gộp lô liên tục"),
    ("vi", "13_serving.ipynb", "Giải mã đầu cơ dùng một mô hình bản nháp.", "Giải mã đầu cơ"),
    ("vi", "13_serving.ipynb", "Tỷ lệ chấp nhận là 0.6.", "Tỷ lệ chấp nhận"),
    ("vi", "10_how_fast.ipynb", "Giả định không có KV cache.", "KV cache"),
    ("zh-CN", "13_serving.ipynb", "贪婪解码每次选概率最大的词元。", "贪婪解码"),
    ("zh-CN", "13_serving.ipynb", "键值缓存保存每个词元的键和值。", "键值缓存"),
    ("zh-CN", "13_serving.ipynb", "预填阶段读入提示词。", "预填"),
    ("zh-CN", "13_serving.ipynb", "持续批处理在每一步接纳请求。", "持续批处理"),
    ("zh-CN", "13_serving.ipynb", "首token时延（TTFT）随排队增大。", "首token"),
    ("zh-CN", "13_serving.ipynb", "投机解码用一个草案模型。", "投机解码"),
    ("zh-CN", "13_serving.ipynb", "接收率为0.6。", "接收率"),
    # chapter 14 (issue 48): the terms of the glossary's Long sequences and experts group
    ("vi", "14_long_and_experts.ipynb", "Song song hóa ngữ cảnh chia một chuỗi dài.", "Song song hóa ngữ cảnh"),
    ("vi", "14_long_and_experts.ipynb", "Trong chú ý vòng, các khối đi quanh vòng.", "chú ý vòng"),
    ("vi", "14_long_and_experts.ipynb", "Ulysses dùng hai phép tất cả-tới-tất cả.", "tất cả-tới-tất cả"),
    ("vi", "14_long_and_experts.ipynb", "Một tầng hỗn hợp các chuyên gia có 4 chuyên gia.", "hỗn hợp các chuyên gia"),
    ("vi", "14_long_and_experts.ipynb", "Trình định tuyến chấm điểm mỗi token.", "Trình định tuyến"),
    ("vi", "14_long_and_experts.ipynb", "Với hệ số sức chứa 1, nhiều token bị rơi.", "hệ số sức chứa"),
    ("vi", "14_long_and_experts.ipynb", "Tổn thất cân bằng tải bằng 1.", "Tổn thất cân bằng tải"),
    ("zh-CN", "14_long_and_experts.ipynb", "语境并行把长序列拆到多个GPU上。", "语境并行"),
    ("zh-CN", "14_long_and_experts.ipynb", "环状注意力让K/V块绕环传递。", "环状注意力"),
    ("zh-CN", "14_long_and_experts.ipynb", "Ulysses用两次all-to-all。", "all-to-all"),
    ("zh-CN", "14_long_and_experts.ipynb", "锯齿形划分让工作量均衡。", "锯齿形"),
    ("zh-CN", "14_long_and_experts.ipynb", "专家混合层有4个专家。", "专家混合"),
    ("zh-CN", "14_long_and_experts.ipynb", "容量系数为1时丢弃的token更多。", "容量系数"),
    ("zh-CN", "14_long_and_experts.ipynb", "负载平衡损失在均匀时为1。", "负载平衡损失"),
    # chapter 15 (issue 49): the terms of the glossary's Planning a run group, and 全交换 in its prose
    ("vi", "15_plan.ipynb", "Mỗi sơ đồ song song cho biết cách chia.", "sơ đồ song song"),
    ("vi", "15_plan.ipynb", "Mức độ song song là một số GPU.", "Mức độ song song"),
    ("vi", "15_plan.ipynb", "Tái tính toán chọn lọc tính lại các điểm số.", "Tái tính toán"),
    ("vi", "15_plan.ipynb", "Trình lập kế hoạch in ra từng thành phần.", "Trình lập kế hoạch"),
    ("vi", "15_plan.ipynb", "Ở hiệu quả tính toán 40%, bước chậm hơn.", "hiệu quả tính toán"),
    ("zh-CN", "15_plan.ipynb", "每种并行配置都有一个名次。", "并行配置"),
    ("zh-CN", "15_plan.ipynb", "每个并行程度是一个GPU数。", "并行程度"),
    ("zh-CN", "15_plan.ipynb", "选择性重算只重做一次乘法。", "选择性重算"),
    ("zh-CN", "15_plan.ipynb", "计划器打印出每一项。", "计划器"),
    ("zh-CN", "15_plan.ipynb", "专家并行的all-to-all无法隐藏。", "all-to-all"),
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
    ("vi", "03_copying.ipynb", "Một lần sao chép chặn phải chờ việc truyền dữ liệu của nó; truyền thông giữa hai GPU."),
    ("vi", "09_model_parallel.ipynb", "Tầng chú ý (attention) dùng cơ chế chú ý; tác nhân (agent) của `torchrun`."),
    ("vi", "08_memory.ipynb", "Giá trị kích hoạt, checkpoint kích hoạt và hàm kích hoạt; **Số liệu đã ghi nhận**."),
    ("vi", "10_how_fast.ipynb", "| Mục | Chỉ có CPU | Một GPU |\n|---|---|---|\n| 10.5 | chạy | cũng vậy |"),
    ("zh-CN", "10_how_fast.ipynb", "张量核（Tensor Core）运行核函数；Jupyter内核；重启内核；由内核结束进程。"),
    ("zh-CN", "10_how_fast.ipynb", "多层感知机（MLP）和`MLPClassifier`；全归约（all-reduce）；隐藏单元数。"),
    ("zh-CN", "08_memory.ipynb", "激活值、激活函数和激活检查点。\n\n**延伸阅读**：PyTorch的文档；**硬件**：仅CPU。"),
    ("zh-CN", "09_model_parallel.ipynb", "| 节 | 仅CPU | 多个GPU |\n|---|---|---|\n| 9.7 | 已发表的数据 | 同上 |"),
    ("vi", "12_kernels.ipynb", "Một ô (tile) trong bộ nhớ dùng chung (shared memory), một mặt nạ (mask), "
     "rào cản (barrier); **Độ chiếm dụng** (occupancy), pipeline phần mềm, softmax trực tuyến; "
     "bộ ghi chuyến bay của chương 11."),
    ("zh-CN", "12_kernels.ipynb", "分块（tile）放在共享内存中；屏障（barrier）；**线程束**（warp）；融合softmax、"
     "算子融合（kernel fusion）；合并访问；占用率；软件流水线；越界检查器。"),
    ("vi", "13_serving.ipynb", "**Bộ nhớ đệm KV** (KV cache); **điền trước** (prefill) và **giải mã** (decode); "
     "cơ chế chú ý truy vấn nhóm (GQA, grouped-query attention); bảng khối (block table); gộp batch liên tục; "
     "giải mã tham lam (greedy decoding), giải mã suy đoán, mô hình nháp, tỉ lệ chấp nhận; `decode_tokens`."),
    ("zh-CN", "13_serving.ipynb", "KV缓存（KV cache）；预填充（prefill）和解码；分组查询注意力、多查询注意力；"
     "块表（block table）、块分配器；连续批处理；首词元时延（TTFT）；推测解码、草稿模型、接受率；仅权重量化。"),
    ("vi", "14_long_and_experts.ipynb", "**Song song ngữ cảnh** (context parallelism): **cơ chế chú ý vòng** "
     "(ring attention), gộp log-sum-exp trực tuyến, bố trí zig-zag, một phép **all-to-all** (trao đổi toàn phần); "
     "**bộ định tuyến** (router), hệ số dung lượng, token **bị bỏ** (dropped), hàm mất mát cân bằng tải; "
     "song song chuyên gia: **phân phát** (dispatch), **kết hợp** (combine)."),
    ("zh-CN", "14_long_and_experts.ipynb", "**上下文并行**（context parallelism）：**环形注意力**（ring attention）、"
     "在线log-sum-exp合并、**之字形**（zig-zag）划分、**全交换**（all-to-all）；**混合专家**（MoE）、"
     "**路由器**（router，一个线性层）、容量因子、丢弃的词元、负载均衡损失；专家并行：**分发**（dispatch）、**合并**（combine）。"),
    ("vi", "15_plan.ipynb", "Một **bố cục song song** (layout) có các **bậc song song** (degree); "
     "**tính toán lại có chọn lọc** (selective recomputation); **bộ lập kế hoạch** (planner) và "
     "`planner.plan`; hiệu suất tính toán 40%."),
    ("zh-CN", "15_plan.ipynb", "**并行布局**（layout）与**并行度**；**选择性重计算**；"
     "**规划器**（planner）与`planner.plan`；计算效率40%；两次**全交换**（all-to-all）。"),
])
def test_the_chosen_terms_pass(tmp_path, language, name, text):
    data = load_terms(TERMS / f"{language}.json")
    assert term_problems(language, data, notebook_with(tmp_path, language, name, text)) == []


@pytest.mark.parametrize(("language", "comment", "words"), [
    ("zh-CN", "# 每 k 步保存一次", "每 k"),
    ("vi", "# 65,536 mẫu", "65,536"),
])
def test_a_style_rule_reads_code_comments_too(tmp_path, language, comment, words):
    cell = nbformat.v4.new_code_cell(f"x = 1  {comment}\ny = 'k 步 65,536'", id="planted-code")
    path = tmp_path / language / "11_survive.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    found = term_problems(language, load_terms(TERMS / f"{language}.json"), tmp_path / language)
    assert found and all(line.startswith(f"editions/{language}/11_survive.ipynb cell planted-code: ") for line in found)
    assert all(words in line for line in found), found  # the same words in the code itself are not read


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

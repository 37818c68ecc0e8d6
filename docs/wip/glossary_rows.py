"""Edition glossary rows for chapter 10 (Meaning column translated), inserted before the last section."""
L = "(10_how_fast.ipynb)"
EN = [  # english, vi, zh, section (the term columns, as in notebooks/glossary.md)
("FLOP, FLOP/s","FLOP, FLOP/s (phép toán dấu phẩy động, mỗi giây)","FLOP、FLOP/s（浮点运算次数、每秒浮点运算次数）","[10.2]"),
("peak compute","hiệu năng tính toán đỉnh","峰值算力","[10.1]"),
("memory bandwidth","băng thông bộ nhớ","内存带宽","[10.1]"),
("HBM (high-bandwidth memory)","HBM (bộ nhớ băng thông cao)","高带宽内存（HBM）","[10.1]"),
("SM (streaming multiprocessor)","SM (bộ đa xử lý luồng)","流式多处理器（SM）","[10.1]"),
("Tensor Core","Tensor Core (lõi tensor)","张量核心（Tensor Core）","[10.1]"),
("warp","warp (nhóm 32 luồng)","线程束（warp）","[10.1]"),
("arithmetic intensity","cường độ số học","算术强度","[10.1]"),
("roofline, ridge point","mô hình roofline, điểm gãy (ridge point)","屋顶线模型、拐点（ridge point）","[10.3]"),
("memory-bound, compute-bound","bị giới hạn bởi bộ nhớ, bị giới hạn bởi tính toán","访存受限、计算受限","[10.1]"),
("MFU, HFU","MFU, HFU (tỷ lệ sử dụng FLOP của mô hình, của phần cứng)","MFU、HFU（模型/硬件算力利用率）","[10.4]"),
("latency-bandwidth (α-β) model","mô hình độ trễ - băng thông (α-β)","延迟-带宽（α-β）模型","[10.5]"),
("algbw, busbw","algbw, busbw (băng thông thuật toán, băng thông bus)","算法带宽（algbw）、总线带宽（busbw）","[10.5]"),
]
VI = [
"Một phép toán dấu phẩy động; một phép nhân-cộng tính là 2. FLOP/s là số phép toán một thiết bị làm được mỗi giây.",
"Số FLOP/s lớn nhất một thiết bị làm được, cho một dtype; bảng thông số ghi nó, một phép nhân ma trận lớn đạt gần tới nó.",
"Số byte mỗi giây mà bộ nhớ của một thiết bị đưa được tới các lõi: 3.35 TB/s với HBM của H100.",
"Bộ nhớ xếp chồng cạnh chip của một GPU trung tâm dữ liệu: bộ nhớ GPU, nơi mọi tensor trên GPU nằm.",
"Một trong nhiều bộ xử lý của GPU, có thanh ghi, bộ nhớ dùng chung, lõi CUDA và lõi Tensor riêng.",
"Một khối trong SM nhân các ma trận nhỏ trong một bước, ở các kiểu 16 bit hoặc TF32; phần lớn hiệu năng đỉnh của GPU đến từ chúng.",
"Một nhóm 32 luồng GPU cùng chạy một lệnh; một SM chuyển qua lại giữa các warp để che độ trễ của bộ nhớ.",
"Số FLOP của một phép toán chia cho số byte nó di chuyển: 0.08 FLOP/B với phép cộng, n/6 với phép nhân hai ma trận float32 n x n.",
"Mô hình roofline: số FLOP/s lớn nhất một phép toán có cường độ cho trước đạt được, min(đỉnh, cường độ x băng thông). Điểm gãy, đỉnh / băng thông, là nơi hai phần của nó gặp nhau.",
"Một phép toán có cường độ dưới điểm gãy phải chờ bộ nhớ; trên điểm gãy, chờ phép tính.",
"Tỷ lệ sử dụng FLOP của mô hình: số FLOP một bước cần chia cho số FLOP hiệu năng đỉnh làm được trong thời gian đó. HFU đếm cả các FLOP tính lại (checkpoint).",
"Thời gian của một phép toán tập thể: số bước x α (độ trễ mỗi bước) cộng số byte một thiết bị gửi chia cho β (băng thông đường truyền).",
"Hai băng thông của nccl-tests: algbw = kích thước / thời gian, con số người gọi thấy; busbw = algbw x 2(n-1)/n với all-reduce, mức mỗi đường truyền đã mang.",
]
ZH = [
"一次浮点运算；一次乘加计为2次。FLOP/s是设备每秒完成的次数。",
"设备在某一数据类型下每秒最多能做的FLOP数；规格表会给出，大的矩阵乘法能接近它。",
"设备内存每秒能送到计算核心的字节数：H100的HBM为3.35 TB/s。",
"堆叠在数据中心GPU芯片旁的内存：即显存，GPU上的每个张量都存放在这里。",
"GPU众多处理器之一，有自己的寄存器、共享内存、CUDA核心和张量核心。",
"SM中一步完成小矩阵乘法的单元，支持16位类型或TF32；GPU的大部分峰值算力来自它们。",
"一起执行同一条指令的32个GPU线程；SM在线程束之间切换，以掩盖内存延迟。",
"操作的FLOP数除以它移动的字节数：加法为0.08 FLOP/B，n x n的float32矩阵乘法为n/6。",
"屋顶线：给定算术强度的操作所能达到的最大FLOP/s，即min(峰值, 强度 x 带宽)。拐点为峰值 / 带宽，是两段相交之处。",
"算术强度低于拐点的操作在等待内存；高于拐点则在等待计算。",
"模型算力利用率：一步所需的FLOP数除以峰值在该时间内能完成的FLOP数。HFU还计入重算的FLOP（检查点）。",
"一次集合通信的时间：步数 x α（每步延迟），加上设备发送的字节数除以β（链路带宽）。",
"nccl-tests的两种带宽：algbw = 数据量 / 时间，即调用者看到的速度；all-reduce的busbw = algbw x 2(n-1)/n，即每条链路实际承载的速率。",
]
import sys
from pathlib import Path
for lang, heading, head, meanings in (
    ("vi", "## Hiệu năng", "| English | Tiếng Việt | 中文 | Ý nghĩa | Học ở mục |", VI),
    ("zh-CN", "## 性能上限", "| English | Tiếng Việt | 中文 | 含义 | 讲解于 |", ZH)):
    path = Path(sys.argv[1]) / "editions" / lang / "glossary.md"
    text = path.read_text(encoding="utf-8")
    last = text.rindex("\n## ")
    rows = "".join(f"| {e} | {v} | {z} | {m} | {s}{L} |\n" for (e, v, z, s), m in zip(EN, meanings))
    block = f"\n{heading}\n\n{head}\n|---|---|---|---|---|\n{rows}"
    path.write_text(text[:last] + "\n" + block.rstrip("\n") + "\n" + text[last:], encoding="utf-8")
    print(lang, "done")

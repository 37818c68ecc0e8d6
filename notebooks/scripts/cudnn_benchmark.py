"""Time the first training steps of a small CNN with cudnn.benchmark off or on (chapter 5b, §5.7). Needs CUDA.

    python scripts/cudnn_benchmark.py False      # or True

Each setting runs in its own fresh process: cuDNN's start (library, handle) is paid first on another shape,
and PyTorch's cache of convolution plans starts empty, so the steps pay only what depends on the setting.
Prints one line of JSON: the 20 step times in seconds.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn


def main(benchmark: bool, steps: int = 20) -> list[float]:
    torch.backends.cudnn.benchmark = benchmark
    device = torch.device("cuda")
    # start cuDNN (library, handle) on another shape, so that the steps below pay only what depends on their shape
    nn.functional.conv2d(torch.randn(1, 3, 8, 8, device=device), torch.randn(4, 3, 3, 3, device=device)).sum().item()
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.SGD(cnn.parameters(), lr=0.01)
    images = torch.randn(64, 3, 64, 64, device=device)
    targets = torch.randint(0, 10, (64,), device=device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(cnn(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] == "True")))

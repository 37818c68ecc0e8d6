"""Time the first operation on a device and the first training steps of a fresh process (chapter 5b, §5.7).

    python scripts/warmup_steps.py DEVICE STEPS      # e.g. cpu 40, cuda 40

Prints one line of JSON: {"first_operation": seconds, "steps": [seconds, ...]}. Each step waits for the device
before its clock stops, so that it measures the step's work, not only its launch.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn


def main(device: torch.device, steps: int) -> dict[str, object]:
    torch.set_num_threads(1)
    start = time.perf_counter()
    torch.ones(1, device=device).sum().item()  # the first operation on the device (a GPU creates its context)
    first_operation = time.perf_counter() - start
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    X, y = torch.randn(128, 32, device=device), torch.randint(0, 10, (128,), device=device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(net(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if device.type != "cpu":
            torch.accelerator.synchronize(device)
        times.append(time.perf_counter() - start)
    return {"first_operation": first_operation, "steps": times}


if __name__ == "__main__":
    print(json.dumps(main(torch.device(sys.argv[1]), int(sys.argv[2]))))

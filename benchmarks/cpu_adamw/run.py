"""torch's AdamW on one CPU core, the for-loop default against `fused=True` (what zero_kit's CPU configs ask
DeepSpeed for: `"torch_adam": true, "fused": true`), on one flat fp32 tensor the size of a ZeRO partition.

    python -m benchmarks.cpu_adamw.run [--elements 1600000] [--steps 200]

Prints the median step time of each and their ratio, with torch's version and the CPU."""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch


def step_ms(elements: int, steps: int, **kind: bool) -> float:
    param = torch.nn.Parameter(torch.randn(elements))
    param.grad = torch.randn(elements)
    optimizer = torch.optim.AdamW([param], lr=1e-4, **kind)
    for _ in range(10):  # the states allocated, caches warm
        optimizer.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1_600_000)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loop = step_ms(args.elements, args.steps, foreach=False)
    fused = step_ms(args.elements, args.steps, fused=True)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread, {args.elements} elements"
    )
    print(f"for-loop AdamW {loop:.2f} ms per step, fused AdamW {fused:.2f} ms per step: {loop / fused:.1f}x")


if __name__ == "__main__":
    main()

"""What one gloo collective costs on this machine, by size and by how many pieces it is cut into: the primitives
that ZeRO-1/2/3 and DDP call on CPU ranks (all-reduce, all-gather into one tensor, reduce-scatter), each median of
7 after one warm-up. From the repository root:

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 benchmarks/comm_buckets/gloo_collectives.py
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 benchmarks/comm_buckets/gloo_collectives.py --elements 3148224

`--elements` is the full (gathered) tensor, in fp32 elements: by default the 58M LLaMA of the README (27,565,568),
the bench model is 3,148,224. Rank 0 prints one line per collective: milliseconds for 1, 2, 4, ... 64 pieces."""

from __future__ import annotations

import argparse
import platform
import statistics
import time


def _seconds(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _median_ms(run, repeats: int = 7) -> float:
    """Milliseconds of `run`: the median of `repeats` calls, after one warm-up call and a barrier."""
    import torch.distributed as dist

    run()
    dist.barrier()
    return statistics.median([_seconds(run) for _ in range(repeats)]) * 1e3


def main() -> None:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=27_565_568, help="full tensor size, fp32 elements")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    n = args.elements - args.elements % (64 * world)
    part = torch.ones(n // world)
    rows: dict[str, list[float]] = {"all_reduce": [], "all_gather_into_tensor": [], "reduce_scatter_tensor": []}
    pieces = [1, 2, 4, 8, 16, 32, 64]
    for count in pieces:
        m = n // world // count  # elements of each rank's share of one piece
        full = [torch.ones(m * world) for _ in range(count)]
        gathered = [torch.empty(m * world) for _ in range(count)]
        shares = [torch.empty(m) for _ in range(count)]
        rows["all_reduce"].append(_median_ms(lambda full=full: [dist.all_reduce(t) for t in full]))
        gather = [(g, part[i * m : (i + 1) * m]) for i, g in enumerate(gathered)]
        rows["all_gather_into_tensor"].append(
            _median_ms(lambda gather=gather: [dist.all_gather_into_tensor(g, p) for g, p in gather])
        )
        scatter = list(zip(shares, full, strict=True))
        rows["reduce_scatter_tensor"].append(
            _median_ms(lambda scatter=scatter: [dist.reduce_scatter_tensor(s, f) for s, f in scatter])
        )
    if dist.get_rank() == 0:
        print(f"{world} ranks, gloo, fp32, full tensor {n:,} elements ({n * 4 / 2**20:.1f} MiB); torch {torch.__version__},"
              f" Python {platform.python_version()}, {platform.machine()}; ms for the whole tensor in N pieces")  # fmt: skip
        print("| collective | " + " | ".join(f"{p} piece{'s' if p > 1 else ''}" for p in pieces) + " |")
        print("|---|" + "---|" * len(pieces))
        for name, values in rows.items():
            print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

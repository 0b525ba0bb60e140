"""Measure the links the step-time model divides by: gloo all-reduce bandwidth (bytes each rank sends per second,
the ring model of zero_kit.metrics) and the per-call latency (a 4-byte all-reduce). Run under torchrun, one rank
per process; rank 0 writes one JSON line to the path given:

    torchrun --nproc_per_node 4 -m benchmarks.link_probe /tmp/probe.json

benchmarks/link_cap.py runs it on one host (4 ranks: the loopback "intra-node" link, with the CPU shared as in
the benchmark) and across its two hosts at every rate (one rank per host: the veth, capped or not).
"""

from __future__ import annotations

import json
import sys
import time

PAYLOAD_BYTES = 8 * 2**20
REPEATS = 4


def _timed(tensor, repeats: int) -> float:
    import torch.distributed as dist

    for _ in range(2):  # warm-up: connections, buffers
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(tensor)
    dist.barrier()
    return (time.perf_counter() - start) / repeats


def main(path: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        world = dist.get_world_size()
        seconds = _timed(torch.ones(PAYLOAD_BYTES // 4), REPEATS)
        latency = _timed(torch.ones(1), 20)
        sent = 2 * (world - 1) / world * PAYLOAD_BYTES  # ring all-reduce, bytes per rank
        if dist.get_rank() == 0:
            result = {"world_size": world, "payload_bytes": PAYLOAD_BYTES, "allreduce_s": seconds,
                      "bytes_per_s": sent / seconds, "latency_s": latency}  # fmt: skip
            with open(path, "w", encoding="utf-8") as f:
                f.write(json.dumps(result) + "\n")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

"""Measure the links the step-time model divides by: gloo all-reduce bandwidth (bytes each rank sends per second,
the ring model of zero_kit.metrics) and the per-call latency (a 4-byte all-reduce). Run under torchrun, one rank
per process; rank 0 writes one JSON line to the path given:

    torchrun --nproc_per_node 4 -m benchmarks.link_cap.probe /tmp/probe.json

benchmarks/link_cap/run.py runs it on one host (4 ranks: the loopback "intra-node" link, with the CPU shared as in
the benchmark) and across its two hosts at every rate (one rank per host: the veth, capped or not).

With --wire DEVICE it measures instead what each collective really sends over the link: every rank reads its
host's DEVICE tx counter (the kernel's count of bytes sent) around WIRE_REPEATS calls of each of all_reduce,
all_gather_into_tensor and reduce_scatter_tensor, WIRE_TRIALS times, and each host keeps its median trial (now
and then, 3 of 20 runs here on 2026-11-25, one all-gather trial counted up to 4% fewer bytes than all others).
Rank 0 writes the bytes per call each host sent next to the ring model's (zero_kit.metrics.ring_bytes, the world
ring crossing each host's link once):

    torchrun --nnodes 2 --nproc_per_node 2 ... -m benchmarks.link_cap.probe --wire veth0 /tmp/wire.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PAYLOAD_BYTES = 8 * 2**20
REPEATS = 9
WIRE_REPEATS = 3
WIRE_TRIALS = 3
KINDS = ("allreduce", "allgather", "reducescatter")


def _timed(tensor, repeats: int) -> float:
    """Median seconds of one all-reduce (each call timed alone: a call slowed by the shared CPU does not count)."""
    import statistics

    import torch.distributed as dist

    for _ in range(2):  # warm-up: connections, buffers
        dist.all_reduce(tensor)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _collective(kind: str, world: int):
    import torch
    import torch.distributed as dist

    full = torch.ones(PAYLOAD_BYTES // 4)
    shard = torch.ones(PAYLOAD_BYTES // 4 // world)
    return {
        "allreduce": lambda: dist.all_reduce(full),
        "allgather": lambda: dist.all_gather_into_tensor(full, shard),
        "reducescatter": lambda: dist.reduce_scatter_tensor(shard, full),
    }[kind]


def _tx_bytes(device: str) -> int:
    with open(f"/sys/class/net/{device}/statistics/tx_bytes", encoding="utf-8") as f:
        return int(f.read())


def _sent_over(device: str, call, local: int) -> int:
    """Bytes this host sent over `device` during WIRE_REPEATS calls (read by local rank 0; others return 0)."""
    import torch.distributed as dist

    dist.barrier()
    before = _tx_bytes(device)
    dist.barrier()  # no rank sends before the reader has read: a late read missed the first chunks (CI, 2 cores)
    for _ in range(WIRE_REPEATS):
        call()
    dist.barrier()
    return _tx_bytes(device) - before if local == 0 else 0


def wire(device: str, path: str) -> None:
    """Bytes each host sends over `device` per call of each collective (module doc)."""
    import statistics

    import torch.distributed as dist

    from zero_kit.metrics import ring_bytes

    dist.init_process_group("gloo")
    try:
        world, local = dist.get_world_size(), int(os.environ["LOCAL_RANK"])
        hosts = world // int(os.environ["LOCAL_WORLD_SIZE"])
        result = {"world_size": world, "hosts": hosts, "payload_bytes": PAYLOAD_BYTES, "kinds": {}}
        for kind in KINDS:
            call = _collective(kind, world)
            call()  # warm-up: connections, buffers
            trials = [_sent_over(device, call, local) for _ in range(WIRE_TRIALS)]
            sent = statistics.median(trials) if local == 0 else 0  # one reader per host
            per_host = [0] * world
            dist.all_gather_object(per_host, sent)
            ring = ring_bytes(kind, PAYLOAD_BYTES, world)  # each rank to its successor; one crossing per host
            result["kinds"][kind] = {
                "wire_bytes_per_call_by_host": [b / WIRE_REPEATS for b in per_host if b],
                "ring_bytes_per_call_per_host": ring if hosts > 1 else 0.0,
            }
        if dist.get_rank() == 0:
            with open(path, "w", encoding="utf-8") as f:
                f.write(json.dumps(result) + "\n")
    finally:
        dist.destroy_process_group()


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


def cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="rank 0 writes its one JSON line here")
    parser.add_argument("--wire", metavar="DEVICE", help="count the bytes each collective sends over DEVICE instead")
    args = parser.parse_args(argv)
    if args.wire:
        wire(args.wire, args.path)
    else:
        main(args.path)


if __name__ == "__main__":
    cli(sys.argv[1:])

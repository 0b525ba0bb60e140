"""Measurements for the benchmark: collective bytes, step times, memory, tensor bytes, MFU.

Every figure says its unit and how it was measured:
- collective bytes: a counting wrapper around the `torch.distributed` collectives. DDP, FSDP2 and DeepSpeed
  (whose `deepspeed.comm` calls `torch.distributed.*`) all go through it; DDP's C++ reducer is routed through
  it by registering PyTorch's stock all-reduce comm hook (see strategies/ddp.py).
- "ring bytes" = bytes one rank sends under the bandwidth-optimal ring algorithm for a collective of that size:
  all-reduce 2(N-1)/N*S, all-gather (N-1)/N*S_out, reduce-scatter and reduce (N-1)/N*S_in, broadcast S.
  This is the accounting of the ZeRO paper (DDP 2Psi, ZeRO-3 3Psi per step), so ratios compare directly.
- link tiers: the ring runs over the collective's group in rank order, and ranks r, r' share a node when
  r // L == r' // L (L = ranks per node, the launcher's LOCAL_WORLD_SIZE / LOCAL_SIZE), as the deepspeed launcher
  and torchrun number them. Each rank's ring bytes go to its ring successor; they are inter-node bytes when the
  successor is on another node. A ring over one group spanning M nodes crosses nodes M times.
- point-to-point sends (`send`, `isend`: pipeline parallelism's activations and their gradients) count the tensor's
  bytes once, on the sender, in the tier of the link to the receiving rank; receives are not counted (the sender
  already did).
- memory: peak RSS (getrusage) on CPU; CUDA max allocated / reserved on GPU.
- communication seconds (while active): wall seconds this rank spends inside a collective call and, for an
  `async_op=True` call, inside its Work's `wait()` (Work.wait is wrapped while installed; a Work is matched by its
  id): the *exposed* time, not what ran in a background thread meanwhile. Kinds (COMM_PHASE): reduction
  (all-reduce, reduce, reduce-scatter) and gather (all-gather, broadcast); sends and all-to-all are not timed.
  DeepSpeed ZeRO-3 and FSDP2 wait their async all-gathers from Python; DDP's reducer waits on its futures in C++,
  so the bench's DDP hook waits on them from Python first (strategies/ddp.py). With NCCL a call returns once
  queued and a wait only makes a stream wait, so on GPUs these seconds are host seconds only. docs/comparing.md
  says what each strategy's figures hold.
"""

from __future__ import annotations

import functools
import resource
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

GIB = 2**30
"""Bytes in a GiB: the one definition (plan, preflight and every report divide by it)."""


def gib(value: float, digits: int = 1, unit: bool = True) -> str:
    """Bytes as GiB, the one formatter: "12.3 GiB" (`digits` decimals; `unit` False: the number alone)."""
    return f"{value / GIB:.{digits}f}" + (" GiB" if unit else "")


# Dense peak FLOP/s per device (vendor spec sheets, no sparsity), by precision. Matched by substring of
# torch.cuda.get_device_name(); the first match wins, so more specific names come first.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12},
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "fp32": 378e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 494.5e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "fp32": 183e12},
    "A10G": {"bf16": 125e12, "fp16": 125e12, "fp32": 62.5e12},
}
# fp32 entries are TF32 tensor-core peaks: the benchmark enables TF32 matmuls when training in fp32 on CUDA.

COMM_PHASE = {"allreduce": "reduction", "reduce": "reduction", "reducescatter": "reduction",
              "allgather": "gather", "broadcast": "gather", "alltoall": "alltoall"}  # fmt: skip
"""Which communication phase a collective's seconds belong to (the ring kinds below); sends: none. alltoall: Ulysses'
exchange of attention heads in every layer (the bench's `_spN` strategies)."""
COMM_PHASES = ("reduction", "gather", "alltoall")

# (function name, which argument holds the payload, ring factor kind)
_COLLECTIVES = {
    "all_reduce": "allreduce",
    "all_reduce_coalesced": "allreduce",
    "reduce": "reduce",
    "broadcast": "broadcast",
    "all_gather": "allgather",
    "all_gather_into_tensor": "allgather",
    "all_gather_single": "allgather",
    "_all_gather_base": "allgather",
    "reduce_scatter": "reducescatter",
    "reduce_scatter_tensor": "reducescatter",
    "reduce_scatter_single": "reducescatter",
    "_reduce_scatter_base": "reducescatter",
    "all_to_all_single": "alltoall",
    "send": "p2p",
    "isend": "p2p",
}


_WAIT = "Work.wait"
_PENDING_LIMIT = 100_000


def _nbytes(obj: Any) -> int:
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return obj.numel() * obj.element_size() if hasattr(obj, "element_size") else 0


def _payload_bytes(name: str, args: tuple, kwargs: dict) -> int:
    """Bytes of the full (unsharded) collective: input for reductions, output for gathers."""
    if name in ("all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_single"):
        out = kwargs.get("tensor_list", kwargs.get("output_tensor", args[0] if args else None))
        return _nbytes(out)
    if name in ("reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single"):
        src = kwargs.get("input_list", kwargs.get("input", args[1] if len(args) > 1 else None))
        return _nbytes(src)
    if name in ("all_reduce_coalesced",):
        return _nbytes(kwargs.get("tensors", args[0] if args else None))
    if name == "all_to_all_single":
        return _nbytes(kwargs.get("input", args[1] if len(args) > 1 else None))
    return _nbytes(kwargs.get("tensor", args[0] if args else None))


def _peer(args: tuple, kwargs: dict) -> tuple[str, int] | None:
    """The receiver of a send as ("global" | "group", rank): `dst` (or the 2nd positional) is a global rank,
    `group_dst` a rank inside the group."""
    if kwargs.get("group_dst") is not None:
        return "group", kwargs["group_dst"]
    dst = kwargs.get("dst", args[1] if len(args) > 1 else None)
    return None if dst is None else ("global", dst)


def ring_bytes(kind: str, payload: int, world: int) -> float:
    """Bytes one rank sends for a collective of `payload` bytes under the ring algorithm (see module doc)."""
    if kind == "p2p":
        return float(payload)
    if world <= 1:
        return 0.0
    share = (world - 1) / world
    factors = {"allreduce": 2 * share, "allgather": share, "reducescatter": share, "reduce": share}
    factors.update({"alltoall": share, "broadcast": 1.0})
    return factors[kind] * payload


def ring_link_tier(group_ranks: list[int], rank: int, ranks_per_node: int) -> str:
    """The tier of `rank`'s outgoing ring link in a group (ring in rank order; node of r = r // ranks_per_node)."""
    successor = group_ranks[(group_ranks.index(rank) + 1) % len(group_ranks)]
    return "intra_node" if rank // ranks_per_node == successor // ranks_per_node else "inter_node"


@dataclass
class CommCounter:
    """Counts collective calls and bytes while `active`. Install before any process group or DeepSpeed
    engine exists: DeepSpeed caches `torch.distributed.all_gather_into_tensor` when its backend starts."""

    active: bool = False
    calls: dict[str, int] = field(default_factory=dict)
    payload: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, dict[int, int]] = field(default_factory=dict)
    sent: float = 0.0
    sent_by_tier: dict[str, float] = field(default_factory=lambda: {"intra_node": 0.0, "inter_node": 0.0})
    ranks_per_node: int = 0
    """L of the link-tier model (0: read the launcher's environment at install)."""
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMM_PHASES, 0.0))
    """Exposed seconds in collectives by COMM_PHASE, while active (module doc)."""
    _tiers: dict[int, str] = field(default_factory=dict)
    _local: threading.local = field(default_factory=threading.local)
    _originals: dict[str, Any] = field(default_factory=dict)
    _pending: dict[int, str] = field(default_factory=dict)
    """id of an async call's Work -> its COMM_PHASE, until its wait() (only the id: holding the Work would keep
    its tensors, e.g. ZeRO-3's gathered parameters, alive)."""

    def install(self) -> CommCounter:
        import os

        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from zero_kit.dist import local_size_from_env

        self.ranks_per_node = self.ranks_per_node or local_size_from_env(dict(os.environ)) or 0

        for name in _COLLECTIVES:
            original = getattr(c10d, name, None) or getattr(dist, name, None)
            if original is None:
                continue
            self._originals[name] = original
            wrapped = self._wrap(name, original)
            for module in (dist, c10d):
                if hasattr(module, name):
                    setattr(module, name, wrapped)
        self._originals[_WAIT] = c10d.Work.wait
        c10d.Work.wait = self._wrap_wait(c10d.Work.wait)
        return self

    def uninstall(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        wait = self._originals.pop(_WAIT, None)
        if wait is not None:
            c10d.Work.wait = wait
        for name, original in self._originals.items():
            for module in (dist, c10d):
                if hasattr(module, name):
                    setattr(module, name, original)
        self._originals.clear()

    def _wrap(self, name: str, original):
        phase = COMM_PHASE.get(_COLLECTIVES[name])

        @functools.wraps(original)
        def counted(*args, **kwargs):
            # Only the outermost call counts: deprecated aliases (e.g. _all_gather_base) call the new names.
            depth = getattr(self._local, "depth", 0)
            outermost = depth == 0
            if self.active and outermost:
                self._record(name, _payload_bytes(name, args, kwargs), kwargs.get("group"), _peer(args, kwargs))
            self._local.depth = depth + 1
            start = time.perf_counter()
            try:
                work = original(*args, **kwargs)
            finally:
                self._local.depth = depth
                if self.active and outermost and phase:
                    self.seconds[phase] += time.perf_counter() - start
            if phase and outermost and getattr(work, "wait", None) is not None:  # async_op: the wait is the rest
                if len(self._pending) > _PENDING_LIMIT:  # Works nobody waits on from Python (ids of dead ones)
                    self._pending.clear()
                self._pending[id(work)] = phase
            return work

        return counted

    def _wrap_wait(self, original):
        @functools.wraps(original)
        def wait(work, *args, **kwargs):
            phase = self._pending.pop(id(work), None)
            if phase is None or not self.active or getattr(self._local, "depth", 0):
                return original(work, *args, **kwargs)
            start = time.perf_counter()
            try:
                return original(work, *args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start

        return wait

    def _record(self, name: str, payload: int, group, peer: tuple[str, int] | None = None) -> None:
        import torch.distributed as dist

        world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.calls[name] = self.calls.get(name, 0) + 1
        self.payload[name] = self.payload.get(name, 0) + payload
        by_size = self.sizes.setdefault(name, {})
        by_size[payload] = by_size.get(payload, 0) + 1
        sent = ring_bytes(_COLLECTIVES[name], payload, world)
        self.sent += sent
        tier = self._peer_tier(group, peer) if _COLLECTIVES[name] == "p2p" else self._tier(group)
        self.sent_by_tier[tier] += sent

    def _peer_tier(self, group, peer: tuple[str, int] | None) -> str:
        """The tier of a point-to-point send: the receiver's node against this rank's."""
        import torch.distributed as dist

        if peer is None or not dist.is_initialized() or self.ranks_per_node < 1:
            return "intra_node"
        kind, rank = peer
        receiver = dist.get_global_rank(group or dist.group.WORLD, rank) if kind == "group" else rank
        return (
            "intra_node" if receiver // self.ranks_per_node == dist.get_rank() // self.ranks_per_node else "inter_node"
        )

    def _tier(self, group) -> str:
        """The link tier this rank's ring bytes cross in `group`: to its ring successor's node or within its own."""
        import torch.distributed as dist

        key = id(group)
        if key not in self._tiers:
            if not dist.is_initialized() or self.ranks_per_node < 1:
                self._tiers[key] = "intra_node"
            else:
                ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
                self._tiers[key] = ring_link_tier(ranks, dist.get_rank(), self.ranks_per_node)
        return self._tiers[key]

    def reset(self) -> None:
        self.calls.clear()
        self.payload.clear()
        self.sizes.clear()
        self.sent = 0.0
        self.sent_by_tier = {tier: 0.0 for tier in self.sent_by_tier}
        self.seconds = dict.fromkeys(COMM_PHASES, 0.0)
        self._pending.clear()

    def summary(self, steps: int) -> dict[str, Any]:
        """Per-step figures over `steps` counted steps."""
        steps = max(steps, 1)
        return {
            "ring_bytes_sent_per_rank": self.sent / steps,
            "ring_bytes_sent_by_tier": {tier: sent / steps for tier, sent in self.sent_by_tier.items()},
            "payload_bytes_by_op": {k: v / steps for k, v in sorted(self.payload.items())},
            "calls_by_op": {k: v / steps for k, v in sorted(self.calls.items())},
            "payload_sizes_by_op": {
                k: {str(b): n / steps for b, n in sorted(v.items())} for k, v in self.sizes.items()
            },
            "exposed_seconds_by_phase": {phase: s / steps for phase, s in self.seconds.items()},
        }


class StepTimer:
    """Wall-clock step times; `synchronize` (e.g. torch.cuda.synchronize) runs before each clock read."""

    def __init__(self, synchronize=None) -> None:
        self.times: list[float] = []
        self._sync = synchronize or (lambda: None)
        self._start = 0.0

    def start(self) -> None:
        self._sync()
        self._start = time.perf_counter()

    def stop(self) -> float:
        self._sync()
        elapsed = time.perf_counter() - self._start
        self.times.append(elapsed)
        return elapsed

    def median(self, warmup: int) -> float:
        timed = self.times[warmup:] or self.times
        return statistics.median(timed) if timed else float("nan")


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors`: a view into a flat buffer counts the whole buffer
    once (what the rank really holds), empty (released) tensors count zero."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def storage_ptrs(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t is not None and t.numel() > 0}


def peak_memory(device_type: str) -> dict[str, int]:
    """Peak RSS of this process in bytes; on CUDA also torch's max allocated / reserved."""
    out = {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux reports KiB
    if device_type == "cuda":
        import torch

        out["cuda_allocated"] = torch.cuda.max_memory_allocated()
        out["cuda_reserved"] = torch.cuda.max_memory_reserved()
    return out


def flops_per_token(n_params: int, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N (matmuls, forward + backward) + 12*L*H*Q*T (attention scores), H*Q = hidden."""
    return 6 * n_params + 12 * layers * hidden * seq_len


def peak_flops(device_name: str, precision: str) -> float | None:
    for key, table in PEAK_FLOPS.items():
        if key in device_name:
            return table[precision]
    return None


def mfu(tokens_per_s_per_device: float, flops_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's dense peak; None when peak unknown."""
    return None if not peak else tokens_per_s_per_device * flops_token / peak


# How DeepSpeed's comms logger sizes a message (deepspeed/comm/utils.py get_msg_size_from_args: the `tensor`
# argument): the local shard for all-gathers, the full input for reductions. Our payload is always the full
# collective, so a gather's payload is world x DeepSpeed's message.
_DS_GATHERS = ("all_gather", "all_gather_into_tensor", "allgather_fn")


class DeepSpeedCommsLog:
    """DeepSpeed's own comms logger (`deepspeed.comm.comms_logger`), switched on exactly while the CommCounter
    counts: an independent record of what DeepSpeed says it communicated, to cross-check the counting wrapper.
    Opt-in (`--ds-comms-log`): the logger synchronizes the device after every collective, which would distort
    GPU step times."""

    def __init__(self) -> None:
        from deepspeed.comm import comm

        self.logger = comm.comms_logger
        self.logger.prof_all, self.logger.verbose, self.logger.enabled = True, False, False
        self.logger.reset_data()

    def set_active(self, active: bool) -> None:
        self.logger.enabled = active

    def summary(self, steps: int, world: int) -> dict[str, Any]:
        """Per step, by DeepSpeed's record name: calls, DeepSpeed's message bytes, and the full-collective payload
        those imply (comparable with CommCounter's `payload_bytes_by_op`)."""
        steps = max(steps, 1)
        out: dict[str, Any] = {}
        for name, by_size in sorted(self.logger.get_raw_data().items()):
            calls = sum(entry[0] for entry in by_size.values())
            message = sum(size * entry[0] for size, entry in by_size.items())
            payload = message * world if name in _DS_GATHERS else message
            out[name] = {"calls": calls / steps, "message_bytes": message / steps, "payload_bytes": payload / steps}
        return out

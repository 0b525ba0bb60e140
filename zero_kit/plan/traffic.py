"""The collectives one optimizer step issues per strategy, the group each runs over, and the bytes they send per
link tier. Pure arithmetic; `zero_kit.plan.timing` turns the bytes into seconds, `zero_kit.plan.memory` ranks by
them, and the benchmark's dist tests compare its measured per-tier bytes with `tier_bytes` (same formulas).

Ψ parameters (Ψt trainable), N = M x L ranks (M nodes of L), a = bytes of the 16-bit dtype (4 in fp32), one micro
batch per optimizer step. S = payload bytes of the whole collective, summed over its calls.

Groups (how the ranks of a node are numbered: r // L, as the deepspeed launcher and torchrun do):
  world: all N ranks, a ring in rank order; node: the L ranks of one node; across: the M ranks with the same
  place in their node (stride L), HSDP's replicate group.

Per strategy (DeepSpeed 0.19.8, torch 2.13 FSDP2):
  DDP: all-reduce of the fp32 gradients, S = 4Ψt, world.
  ZeRO-0: all-reduce of the 16-bit gradients, S = aΨt, world.
  ZeRO-1/2 (use_multi_rank_bucket_allreduce): all-reduce of the reduce buckets, S = aΨt, then all-gather of the
    updated partitions, S = aΨt, world. In fp32 1.5x DDP's bytes, as measured.
  ZeRO-3: all-gather in forward, S = aΨ, world; in backward only what was released: with live-parameter budget
    and reuse distance B (the generator's 1e9, zero3_release's 0) the last min(Ψ, B, B/2) parameters of forward
    stay gathered; then reduce-scatter, S = aΨt, world. With bf16 states (row zero3_bf16) a = 2 always.
  ZeRO-3 hpZ: as ZeRO-3, but a released parameter is re-gathered from its secondary partition over the node
    (partition_parameters.py `_all_gather_params`: `zero_param_process_group` when `ds_secondary_tensor` exists);
    the forward all-gather after each step runs over the world (stage3.py drops the secondary partitions after
    every step). So the backward all-gather is `node`, the rest `world`. (With gradient accumulation the forward
    passes after the first of a step gather from the node too; the model counts one micro batch.)
  FSDP2: all-gather in forward (aΨ) and again in backward except the root (embeddings, head, final norm stay
    unsharded after forward), reduce-scatter of fp32 gradients (4Ψt), all world.
  FSDP2 HSDP (2D mesh M x L): the same all-gathers and reduce-scatter over the `node`, then an all-reduce of the
    reduced shard, S = 4Ψt/L, `across`.
  FSDP2 reshard_after_forward=L: as FSDP2, but the backward all-gather runs over the `node` group (the blocks
    kept a node-sized shard after forward).

Ulysses sequence parallelism (--sp, any strategy above, whose collectives stay over the world): in every attention
layer DeepSpeed's UlyssesSPAttentionHF turns q, k and v from the rank's b x s/sp tokens of all heads into the whole
sequence of heads/sp, and the attention output back: 4 all-to-alls a layer, each rank's payload its own b s/sp x
(heads x head_dim) activations (k and v with the key/value heads, replicated up to sp when fewer), a = the run's
precision. Backward sends the same in reverse and activation checkpointing repeats the forward's (3 passes, else
2). Over the sp group, consecutive ranks inside one node (the run refuses a group across nodes); each rank sends
(sp-1)/sp of its payload; not overlapped with compute.

Ring model (metrics.ring_bytes): in a group of G ranks each rank sends B = 2(G-1)/G x S for an all-reduce, (G-1)/G
x S for an all-gather or reduce-scatter, to its ring successor (metrics.ring_link_tier). A world ring crosses
nodes M times (when M > 1): of all ranks' bytes, M x B are inter-node and (N - M) x B intra-node. A node ring is
all intra-node (N x B_L), an across ring all inter-node (N x B_M). Per node over its network: the world ring's
one link, B; the across rings of its L ranks, L x B_M.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zero_kit.metrics import ring_bytes
from zero_kit.plan.accounting import DTYPE_BYTES
from zero_kit.plan.workload import Workload
from zero_kit.strategies import StrategyInfo

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP bucket_cap_mb default
ALLGATHER_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed allgather_bucket_size default
ZERO3_LIVE_LIMIT = 1_000_000_000  # the generator's stage3_max_live_parameters and stage3_max_reuse_distance


@dataclass(frozen=True)
class Collective:
    what: str
    kind: str
    """allreduce, allgather or reducescatter (metrics.ring_bytes)."""
    payload: int
    """Bytes of the whole collective per step, summed over its calls."""
    calls: int
    overlappable: bool
    group: str = "world"
    """world, node or across (module doc); sp for Ulysses' group; tp, dp or pp for a model-parallel layout
    (zero_kit.plan.parallel)."""
    size: int = 0
    """A layout's group (0: the named group): `size` ranks `stride` apart, in blocks of size x stride ranks."""
    stride: int = 1


@dataclass(frozen=True)
class TierBytes:
    """Ring bytes per step of one collective (or a step's sum), summed over all ranks, by link tier."""

    intra_node: float = 0.0
    inter_node: float = 0.0
    per_rank: float = 0.0
    """Bytes each rank sends (every rank of the group sends the same)."""

    def __add__(self, other: TierBytes) -> TierBytes:
        return TierBytes(
            self.intra_node + other.intra_node, self.inter_node + other.inter_node, self.per_rank + other.per_rank
        )


def _ceil(a: float, b: float) -> int:
    return max(1, -(-int(a) // int(b)))


GROUPS = ("world", "node", "across")


def group_size(group: str, nodes: int, ranks_per_node: int) -> int:
    return {"world": nodes * ranks_per_node, "node": ranks_per_node, "across": nodes}[group]


def tier_bytes(collective: Collective, nodes: int, ranks_per_node: int) -> TierBytes:
    """All ranks' ring bytes of `collective` per step, split as metrics.ring_link_tier splits them (module doc)."""
    world = nodes * ranks_per_node
    if collective.size:
        return grid_tier_bytes(collective, world, ranks_per_node)
    sent = ring_bytes(collective.kind, collective.payload, group_size(collective.group, nodes, ranks_per_node))
    match collective.group:
        case "world":
            crossing = nodes if nodes > 1 else 0  # the last rank of every node sends to the next node
            return TierBytes((world - crossing) * sent, crossing * sent, sent)
        case "node":
            return TierBytes(world * sent, 0.0, sent)
        case "across":
            return TierBytes(0.0, world * sent, sent)
    raise ValueError(f"unknown group {collective.group!r}; choose from {list(GROUPS)}")


def step_tier_bytes(info: StrategyInfo, work: Workload, nodes: int, ranks_per_node: int) -> TierBytes:
    """A step's collectives summed: what `zero-kit bench` records as ring_bytes_sent_all_ranks_by_tier."""
    if nodes * ranks_per_node <= 1:
        return TierBytes()
    total = TierBytes()
    for collective in collectives(info, work, ranks_per_node):
        total += tier_bytes(collective, nodes, ranks_per_node)
    return total


def collectives(info: StrategyInfo, work: Workload, ranks_per_node: int = 1) -> list[Collective]:
    """The collectives one optimizer step issues (module doc), with their payloads, call counts and groups.
    `ranks_per_node` sizes HSDP's cross-node all-reduce (the shard of one node's rank)."""
    return _data_parallel(info, work, ranks_per_node) + ulysses(work)


def ulysses(work: Workload) -> list[Collective]:
    """Ulysses sequence parallelism's all-to-alls (`--sp`; module doc), none without it."""
    if work.sp <= 1:
        return []
    shape = work.shape
    head_dim = shape.hidden_size // shape.heads
    heads = 2 * shape.heads + 2 * max(shape.kv_heads, work.sp)  # q and out; k and v, replicated up to sp
    per_pass = shape.layers * work.rank_tokens * heads * head_dim * DTYPE_BYTES[work.precision]
    passes = 3 if work.activation_checkpointing else 2  # forward, backward, and the forward recomputed
    return [Collective("all-to-all q/k/v/out (Ulysses)", "alltoall", passes * per_pass, 4 * passes * shape.layers,
                       False, "sp", size=work.sp)]  # fmt: skip


def _data_parallel(info: StrategyInfo, work: Workload, ranks_per_node: int) -> list[Collective]:
    psi, trainable = work.n_params, work.trainable_params or work.n_params
    a = 2 if info.low_precision_states else DTYPE_BYTES[work.precision]
    match info.accounting:
        case "ddp":
            calls = _ceil(4 * trainable, DDP_BUCKET_BYTES)
            return [Collective("all-reduce fp32 grads", "allreduce", 4 * trainable, calls, True)]
        case "zero0":
            calls = _ceil(trainable, work.shape.hidden_size**2)
            return [Collective("all-reduce grads", "allreduce", a * trainable, calls, False)]
        case "zero1" | "zero2":
            buckets = _ceil(trainable, _reduce_bucket(work.shape.hidden_size))
            gathers = _ceil(trainable, ALLGATHER_BUCKET_ELEMENTS)
            return [
                Collective("all-reduce grad buckets", "allreduce", a * trainable, buckets, True),
                Collective("all-gather updated params", "allgather", a * trainable, gathers, False),
            ]
        case "zero3" | "zero3_bf16":
            return _zero3(info, work, a, psi, trainable, ranks_per_node)
        case "fsdp":
            return _fsdp(info, work, a, psi, trainable, ranks_per_node)
    raise ValueError(f"unknown strategy {info.accounting!r}")


def zero3_kept_params(zero_overrides: Mapping[str, object], psi: int) -> int:
    """Parameters ZeRO-3 keeps gathered from their forward to their backward: after each module DeepSpeed releases
    only the parameters not used again within stage3_max_reuse_distance elements of fetches (its coordinator's
    trace of the module order, from the second step on). A layer's backward comes about twice the parameters after it
    later, so the last min(Ψ, reuse / 2) stay gathered: with the generator's 1e9, a whole model up to 0.5B, and 0.5B
    parameters of a larger one. stage3_max_live_parameters bounds only the prefetch, not what stays. Measured on one
    CPU rank (tests/unit/test_accounting.py): all of Ψ kept at 1e9, none at 0, 57% at a reuse distance of Ψ. The
    backward gathers only the rest again (`_zero3`); the memory model charges these (plan.memory.buffer_terms)."""
    reuse = int(zero_overrides.get("stage3_max_reuse_distance", ZERO3_LIVE_LIMIT))
    return min(psi, reuse // 2)


def _zero3(info: StrategyInfo, work: Workload, a: int, psi: int, trainable: int, per_node: int) -> list[Collective]:
    shape = work.shape
    modules = 7 * shape.layers + 2  # one fetch per linear (norms are persistent) + embeddings + head
    regathered = psi - zero3_kept_params(info.zero_overrides, psi)
    out = [Collective("all-gather params (fwd)", "allgather", a * psi, modules, True)]
    if regathered:
        group = "node" if info.hierarchy == "hpz" and per_node > 1 else "world"  # hpZ needs 2+ ranks per node
        calls = _ceil(modules * regathered / psi, 1)
        out.append(Collective("all-gather params (bwd)", "allgather", a * regathered, calls, True, group))
    buckets = _ceil(trainable, _reduce_bucket(shape.hidden_size))
    out.append(Collective("reduce-scatter grads", "reducescatter", a * trainable, buckets, True))
    return out


def _reduce_bucket(hidden_size: int) -> int:
    """The generator's reduce bucket in elements (zero_kit.config.builder.bucket_sizes)."""
    from zero_kit.config.builder import bucket_sizes

    return bucket_sizes(hidden_size)["reduce_bucket_size"]


def _fsdp(info: StrategyInfo, work: Workload, a: int, psi: int, trainable: int, per_node: int) -> list[Collective]:
    shape = work.shape
    root = max(0, psi - shape.layers * shape.block_params)
    blocks = shape.layers + 1
    inside = "node" if info.hierarchy == "hsdp" else "world"
    backward = "node" if info.hierarchy in ("hsdp", "reshard_node") else "world"
    out = [
        Collective("all-gather params (fwd)", "allgather", a * psi, blocks, True, inside),
        Collective("all-gather params (bwd)", "allgather", a * (psi - root), shape.layers, True, backward),
        Collective("reduce-scatter fp32 grads", "reducescatter", 4 * trainable, blocks, True, inside),
    ]
    if info.hierarchy == "hsdp":
        shard = 4 * -(-trainable // max(per_node, 1))
        out.append(Collective("all-reduce grad shards across nodes", "allreduce", shard, blocks, True, "across"))
    return out


def grid_members(rank: int, size: int, stride: int) -> list[int]:
    """The ranks of `rank`'s group in a layout grid: `size` ranks `stride` apart (zero_kit.plan.parallel's order:
    rank = (stage x dp + dp index) x tp + tp index, so tp groups are neighbours, dp groups stride tp, pp stride dp x tp)."""
    block = size * stride
    base = rank // block * block + rank % stride
    return [base + i * stride for i in range(size)]


def grid_tier_bytes(collective: Collective, world: int, ranks_per_node: int) -> TierBytes:
    """Tier bytes of a layout group's collective by enumerating every rank's outgoing link (world <= 100k ranks).
    Ring collectives send to the ring successor; "p2p" (a pipeline's activations forward, their gradients back)
    sends `payload` to the next stage and `payload` to the previous one, so the end stages send half as much."""
    intra = inter = peak = 0.0
    for rank in range(world):
        members = grid_members(rank, collective.size, collective.stride)
        index = members.index(rank)
        if collective.kind == "p2p":
            peers = [m for m in (index - 1, index + 1) if 0 <= m < len(members)]
            links = [(members[m], collective.payload) for m in peers]
        else:
            links = [
                (members[(index + 1) % len(members)], ring_bytes(collective.kind, collective.payload, len(members)))
            ]
        for peer, sent in links:
            if peer == rank or not sent:
                continue
            if peer // ranks_per_node == rank // ranks_per_node:
                intra += sent
            else:
                inter += sent
        peak = max(peak, sum(sent for peer, sent in links if peer != rank))
    return TierBytes(intra, inter, peak)

"""Predicted step time per option: compute, collectives per link tier, offload. Pure arithmetic beside
`zero_kit.plan.memory`; the rates come from `zero_kit.plan.rates`.

Ψ parameters (Ψt trainable), N = M x L ranks (M nodes of L GPUs), a = bytes of the 16-bit dtype (4 in fp32),
b micro batch, s sequence, one micro batch per optimizer step.

Compute: T_comp = F x b x s / R, F = metrics.flops_per_token (6Ψ + 12 L h s; LoRA 4Ψ + ..., no weight
gradients for the frozen base), x 4/3 with activation checkpointing (one more forward), R = peak x MFU (or the
calibrated FLOP/s).

Collectives per step, their groups and their bytes per link tier: `zero_kit.plan.traffic` (module doc). Each
GPU's intra-node link carries the bytes one rank sends over a group with intra-node links; each node's
inter-node link carries the all-ranks inter-node bytes over M (the world ring's one crossing, B; HSDP's across
rings, L x B_M). NCCL's rings run in parallel over all NICs, so those bytes are spread over the node's whole
inter-node bandwidth. The links work at once, so a collective takes the slower of the two:

    T_c = max(B_intra / W_intra, B_inter_node / W_inter) + alpha x calls       (alpha-beta model, alpha = --latency-us)

and is charged to that tier. The bytes are the ring model's (NCCL's ring, and gloo's ring all-reduce and
all-gather), except that with --comm-backend gloo a reduce-scatter costs a whole all-reduce: ProcessGroupGloo's
reduce_scatter_tensor clones the input, all-reduces it and keeps its own chunk (reduce_scatter_tensor_coalesced in
torch/csrc/distributed/c10d/ProcessGroupGloo.cpp); the two-host rig's veth counter confirms it on the installed
torch (benchmarks/link_cap/probe.py --wire, tests/multinode/test_gloo_wire.py).

Overlap: hidden = min(f x sum of T_c over overlappable collectives, T_comp), f = --assume overlap (0.8); the rest
is exposed.

Offload (ZeRO-Offload), not overlapped: PCIe: aΨt/N of gradients to the host and aΨt/N of updated parameters
back per GPU (parameter offload adds aΨ/N per all-gather pass), at the PCIe bandwidth; CPU Adam: memory bound,
L x Ψt/N x 30 bytes per node (--assume cpu_adam_bytes) at the node's memory bandwidth (--assume cpu_mem_gbs).

Overhead: the seconds per step a strategy's framework spends beyond all that (hooks, bucket and flat-buffer
copies, partitioned optimizer bookkeeping), 0 unless calibrated from a measured run of that strategy on one node
(zero_kit.plan.calibration: measured step minus this model's step at the run's own layout). It is host work, so it
runs while the ranks wait on a link: each collective waits T_c minus the time the host itself spends moving its
bytes (bytes / host_copy rate; the ranks' CPUs do it with gloo on CPU ranks, none of it with NCCL), and

    exposed overhead = max(0, overhead - sum of those waits).

Found on the two-host rig (benchmarks/link_cap/results): the one-host overhead, added in full, overshoots every
strategy at 200mbit (up to +40-58% for ZeRO-3) while compute + comm alone match; the slow link's wait absorbs it.

Step = T_comp + exposed comm + T_offload + exposed overhead. The dominant term is the largest of compute,
intra-node comm, inter-node comm, offload and overhead (their full times, before overlap).

The same step in the bench's phase names (`StepTime.phases`, `zero-kit plan --json`: timing.phases_s) is a
regrouping of these terms, not another model: forward_backward = T_comp (the model does not split the two), and
the seconds of Ulysses' all-to-alls (`--sp`), which run inside attention;
reduction and gather = the full seconds of the reducing (all-reduce, reduce-scatter) and gathering (all-gather)
collectives; hidden_comm = minus the hidden seconds (the bench's reduction and gather columns are what stayed
exposed, so they compare with these two less the overlap); p2p = a pipeline's sends; step = T_offload (the GPU's
own optimizer step is not modelled); other = the exposed overhead. They add up to the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from zero_kit.metrics import COMM_PHASE, flops_per_token
from zero_kit.plan.accounting import DTYPE_BYTES
from zero_kit.plan.memory import Hardware, Workload, offload_of
from zero_kit.plan.rates import Rates
from zero_kit.plan.traffic import Collective, TierBytes, collectives, tier_bytes
from zero_kit.strategies import StrategyInfo

__all__ = ["Collective", "CommTime", "StepTime", "collectives", "comm_time", "step_time"]
TERMS = ("compute", "intra-node comm", "inter-node comm", "offload", "overhead")


@dataclass(frozen=True)
class CommTime:
    collective: Collective
    ring_bytes: float
    """Bytes each GPU sends per step over the collective's group."""
    intra_s: float
    inter_s: float
    latency_s: float
    tiers: TierBytes = TierBytes()
    """All ranks' bytes per tier (zero_kit.plan.traffic.tier_bytes)."""

    copy_s: float = 0.0
    """Of `seconds`, the time the host itself moves the bytes (Rates.host_copy_bytes_per_s); the rest is waiting."""

    @property
    def seconds(self) -> float:
        return max(self.intra_s, self.inter_s) + self.latency_s

    @property
    def wait_s(self) -> float:
        return max(0.0, max(self.intra_s, self.inter_s) - self.copy_s)

    @property
    def tier(self) -> str:
        return "inter-node comm" if self.inter_s >= self.intra_s and self.inter_s > 0 else "intra-node comm"


@dataclass
class StepTime:
    compute_s: float
    comms: list[CommTime]
    hidden_s: float
    pcie_s: float = 0.0
    cpu_adam_s: float = 0.0
    overhead_s: float = 0.0
    """Calibrated framework seconds per step (module doc)."""
    tokens_per_step: int = 0
    """Tokens all ranks process per step."""
    terms: dict[str, float] = field(default_factory=dict)
    bubble_s: float = 0.0
    """Of compute_s, the pipeline's idle slots (zero_kit.plan.parallel_options)."""

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.comms)

    @property
    def offload_s(self) -> float:
        return self.pcie_s + self.cpu_adam_s

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s - self.hidden_s + self.offload_s + self.overhead_s - self.overhead_hidden_s

    @property
    def overhead_hidden_s(self) -> float:
        """Of overhead_s, what runs while the ranks wait on a link (module doc)."""
        return min(self.overhead_s, sum(c.wait_s for c in self.comms)) if self.overhead_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def dominant(self) -> str:
        return max(TERMS, key=lambda name: self.terms[name])

    @property
    def phases(self) -> dict[str, float]:
        """The step in the bench's phase names, the same terms regrouped (module doc); the values add up to step_s."""
        by_kind = {"reduction": 0.0, "gather": 0.0, "p2p": 0.0}
        inside = 0.0  # Ulysses' all-to-alls run inside attention: the bench times them in forward and backward
        for c in self.comms:
            if c.collective.kind == "alltoall":
                inside += c.seconds
            else:
                by_kind[COMM_PHASE.get(c.collective.kind, "p2p")] += c.seconds  # the bench's kinds; sends: p2p
        return {
            "forward_backward": self.compute_s + inside,
            **by_kind,
            "hidden_comm": -self.hidden_s,
            "step": self.offload_s,
            "other": self.overhead_s - self.overhead_hidden_s,
        }


def on_the_wire(collective: Collective, backend: str) -> Collective:
    """The collective as `backend` runs it: gloo's reduce-scatter is an all-reduce (module doc)."""
    if backend == "gloo" and collective.kind == "reducescatter":
        return replace(collective, kind="allreduce")
    return collective


def comm_time(collective: Collective, hardware: Hardware, rates: Rates) -> CommTime:
    tiers = tier_bytes(on_the_wire(collective, rates.comm_backend), hardware.nodes, hardware.gpus_per_node)
    intra = tiers.per_rank / rates.intra_bytes_per_s if tiers.intra_node else 0.0
    inter = tiers.inter_node / hardware.nodes / rates.inter_bytes_per_s if tiers.inter_node else 0.0
    latency = rates.latency_s * collective.calls if tiers.per_rank else 0.0
    host = rates.host_copy_bytes_per_s
    copy = max(tiers.per_rank, tiers.inter_node / hardware.nodes) / host if host else 0.0
    return CommTime(collective, tiers.per_rank, intra, inter, latency, tiers, copy)


def compute_seconds(work: Workload, rates: Rates) -> float:
    shape = work.shape
    flops = flops_per_token(work.n_params, shape.layers, shape.hidden_size, work.seq_len)
    if work.lora_r:  # frozen weights need no weight gradients: 2Ψ of the 6Ψ go
        flops -= 2 * (work.n_params - (work.trainable_params or 0))
    if work.activation_checkpointing:
        flops *= 4 / 3
    if work.tiled:  # TiledMLP and the tiled loss run each slice's MLP and output head forward again in backward
        flops += 2 * (
            shape.layers * 3 * shape.hidden_size * shape.intermediate_size + shape.vocab_size * shape.hidden_size
        )
    # DPO: the frozen reference's forward (2 FLOPs per parameter per token) over both sequences, unless precomputed
    if work.preference and not work.reference_precomputed:
        flops += 2 * work.n_params
    return flops * work.rank_tokens / rates.flops_per_s  # a sequence-parallel rank computes its 1/sp


PRECOMPUTE_PAIRS = 1000
"""The pairs `precompute_seconds` is quoted for: the plan does not know the data set's size."""


def precompute_seconds(work: Workload, world_size: int, rates: Rates, pairs: int = PRECOMPUTE_PAIRS) -> float:
    """DPO with precomputed reference log-probabilities (`--dpo-reference precompute`): the one-off forward of the
    starting model over `pairs` pairs, both sequences, before training, shared by every rank (2 FLOPs per parameter
    per token). A run with the reference model spends the same on each pair every time it reads it (the reference
    term of `compute_seconds`); the gathers of a ZeRO-3 forward are not counted."""
    return pairs * 2 * work.seq_len * 2 * work.n_params / world_size / rates.flops_per_s


def offload_seconds(info: StrategyInfo, work: Workload, hardware: Hardware, rates: Rates) -> tuple[float, float]:
    """(PCIe seconds per GPU, CPU Adam seconds per node) per step; zero without offload."""
    offload = offload_of(info)
    if offload == "none":
        return 0.0, 0.0
    n = hardware.world_size
    a = DTYPE_BYTES[work.precision]
    trainable = work.trainable_params or work.n_params
    pcie = 2 * a * trainable / n
    if offload == "optimizer+param":
        passes = len([c for c in collectives(info, work) if c.kind == "allgather"])
        pcie += passes * a * work.n_params / n
    adam = hardware.gpus_per_node * trainable / n * rates.cpu_adam_bytes
    return pcie / rates.pcie_bytes_per_s, adam / rates.cpu_mem_bytes_per_s


def step_time(info: StrategyInfo, work: Workload, hardware: Hardware, rates: Rates) -> StepTime:
    compute = compute_seconds(work, rates)
    per_node = hardware.gpus_per_node
    comms = (
        [comm_time(c, hardware, rates) for c in collectives(info, work, per_node)] if hardware.world_size > 1 else []
    )
    overlappable = sum(c.seconds for c in comms if c.collective.overlappable)
    hidden = min(rates.overlap * overlappable, compute)
    pcie, adam = offload_seconds(info, work, hardware, rates)
    terms = dict.fromkeys(TERMS, 0.0)
    terms["compute"] = compute
    for c in comms:
        terms[c.tier] += c.seconds
    terms["offload"] = pcie + adam
    terms["overhead"] = overhead = rates.overhead_s.get(info.name, 0.0)
    tokens = work.rank_tokens * hardware.world_size
    return StepTime(compute, comms, hidden, pcie, adam, overhead, tokens, terms)

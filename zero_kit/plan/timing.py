"""Predicted step time per option: compute, collectives per link tier, offload. Pure arithmetic beside
`zero_kit.plan.memory`; the rates come from `zero_kit.plan.rates`.

Ψ parameters (Ψt trainable), N = M x L ranks (M nodes of L GPUs), a = bytes of the 16-bit dtype (4 in fp32),
b micro batch, s sequence, one micro batch per optimizer step.

Compute: T_comp = F x b x s / R, F = metrics.flops_per_token (6Ψ + 12 L h s; LoRA 4Ψ + ..., no weight
gradients for the frozen base), x 4/3 with activation checkpointing (one more forward), R = peak x MFU (or the
calibrated FLOP/s).

Collectives per step (S = payload bytes of the whole collective, summed over its calls):
  DDP: all-reduce of the fp32 gradients, S = 4Ψt, bucketed (25 MiB) and overlapping backward.
  ZeRO-0 (DeepSpeed): all-reduce of the 16-bit gradients, S = aΨt, after backward.
  ZeRO-1/2 as DeepSpeed 0.19.8 runs them (use_multi_rank_bucket_allreduce): all-reduce of each reduce bucket,
    S = aΨt, overlapping backward (overlap_comm), then all-gather of the updated partitions, S = aΨt, after the
    step. In fp32 that is 1.5x DDP's bytes, as measured (benchmarks/results/README.md).
  ZeRO-3: all-gather in forward, S = aΨ; in backward only what was released: with the generator's
    max_live_parameters = max_reuse_distance = 1e9 the last min(Ψ, 1e9, 1e9/2) parameters of forward stay
    gathered (a parameter's forward-to-backward reuse distance is about twice the parameters after it); then
    reduce-scatter, S = aΨt. For the tiny CPU models this is the measured 1.0x DDP. All overlapped (prefetch,
    overlap_comm).
  FSDP2: all-gather in forward (aΨ, bf16 param_dtype) and again in backward except the root (embeddings, head,
    final norm stay unsharded after forward), reduce-scatter of fp32 gradients (4Ψt). All overlapped (prefetch).

Ring model (metrics.ring_bytes): one rank sends B = 2(N-1)/N x S for an all-reduce, (N-1)/N x S for an
all-gather or reduce-scatter, to its successor. The ring over N = M x L ranks crosses nodes M times, so of its
N links L-1 of every L stay in a node and each node sends exactly one link's share, B, over its network: every
GPU's intra-node link carries B (when L > 1) and every node's inter-node link carries B (when M > 1). NCCL's
rings run in parallel over all NICs, so B is spread over the node's whole inter-node bandwidth. The links work
at once, so a collective takes the slower of the two:

    T_c = max(B / W_intra, B / W_inter) + alpha x calls       (alpha-beta model, alpha = --latency-us)

and is charged to that tier. Overlap: hidden = min(f x sum of T_c over overlappable collectives, T_comp),
f = --assume overlap (0.8); the rest is exposed.

Offload (ZeRO-Offload), not overlapped: PCIe: aΨt/N of gradients to the host and aΨt/N of updated parameters
back per GPU (parameter offload adds aΨ/N per all-gather pass), at the PCIe bandwidth; CPU Adam: memory bound,
L x Ψt/N x 30 bytes per node (--assume cpu_adam_bytes) at the node's memory bandwidth (--assume cpu_mem_gbs).

Step = T_comp + exposed comm + T_offload. The dominant term is the largest of compute, intra-node comm,
inter-node comm and offload (their full times, before overlap).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_kit.metrics import flops_per_token, ring_bytes
from zero_kit.plan.accounting import DTYPE_BYTES
from zero_kit.plan.memory import Hardware, Workload, offload_of
from zero_kit.plan.rates import Rates
from zero_kit.strategies import StrategyInfo

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP bucket_cap_mb default
ALLGATHER_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed allgather_bucket_size default
ZERO3_LIVE_LIMIT = 1_000_000_000  # the generator's stage3_max_live_parameters and stage3_max_reuse_distance
TERMS = ("compute", "intra-node comm", "inter-node comm", "offload")


@dataclass(frozen=True)
class Collective:
    what: str
    kind: str
    """allreduce, allgather or reducescatter (metrics.ring_bytes)."""
    payload: int
    """Bytes of the whole collective per step, summed over its calls."""
    calls: int
    overlappable: bool


@dataclass(frozen=True)
class CommTime:
    collective: Collective
    ring_bytes: float
    """Bytes each GPU sends per step (= bytes each node sends over its inter-node link when M > 1)."""
    intra_s: float
    inter_s: float
    latency_s: float

    @property
    def seconds(self) -> float:
        return max(self.intra_s, self.inter_s) + self.latency_s

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
    tokens_per_step: int = 0
    """Tokens all ranks process per step."""
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.comms)

    @property
    def offload_s(self) -> float:
        return self.pcie_s + self.cpu_adam_s

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s - self.hidden_s + self.offload_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def dominant(self) -> str:
        return max(TERMS, key=lambda name: self.terms[name])


def _ceil(a: float, b: float) -> int:
    return max(1, -(-int(a) // int(b)))


def collectives(info: StrategyInfo, work: Workload) -> list[Collective]:
    """The collectives one optimizer step issues (module doc), with their payloads and call counts."""
    shape = work.shape
    psi, trainable = work.n_params, work.trainable_params or work.n_params
    a = DTYPE_BYTES[work.precision]
    reduce_bucket = shape.hidden_size**2  # zero_kit.config.builder.bucket_sizes
    match info.accounting:
        case "ddp":
            return [
                Collective(
                    "all-reduce fp32 grads", "allreduce", 4 * trainable, _ceil(4 * trainable, DDP_BUCKET_BYTES), True
                )
            ]
        case "zero0":
            return [Collective("all-reduce grads", "allreduce", a * trainable, _ceil(trainable, reduce_bucket), False)]
        case "zero1" | "zero2":
            return [
                Collective(
                    "all-reduce grad buckets", "allreduce", a * trainable, _ceil(trainable, reduce_bucket), True
                ),
                Collective(
                    "all-gather updated params",
                    "allgather",
                    a * trainable,
                    _ceil(trainable, ALLGATHER_BUCKET_ELEMENTS),
                    False,
                ),
            ]
        case "zero3":
            modules = 7 * shape.layers + 2  # one fetch per linear (norms are persistent) + embeddings + head
            regathered = psi - min(psi, ZERO3_LIVE_LIMIT, ZERO3_LIVE_LIMIT // 2)
            out = [Collective("all-gather params (fwd)", "allgather", a * psi, modules, True)]
            if regathered:
                share = regathered / psi
                out.append(
                    Collective("all-gather params (bwd)", "allgather", a * regathered, _ceil(modules * share, 1), True)
                )
            out.append(
                Collective(
                    "reduce-scatter grads", "reducescatter", a * trainable, _ceil(trainable, reduce_bucket), True
                )
            )
            return out
        case "fsdp":
            root = max(0, psi - shape.layers * shape.block_params)
            blocks = shape.layers + 1
            return [
                Collective("all-gather params (fwd)", "allgather", a * psi, blocks, True),
                Collective("all-gather params (bwd)", "allgather", a * (psi - root), shape.layers, True),
                Collective("reduce-scatter fp32 grads", "reducescatter", 4 * trainable, blocks, True),
            ]
    raise ValueError(f"unknown strategy {info.accounting!r}")


def comm_time(collective: Collective, hardware: Hardware, rates: Rates) -> CommTime:
    sent = ring_bytes(collective.kind, collective.payload, hardware.world_size)
    intra = sent / rates.intra_bytes_per_s if hardware.gpus_per_node > 1 and sent else 0.0
    inter = sent / rates.inter_bytes_per_s if hardware.nodes > 1 and sent else 0.0
    latency = rates.latency_s * collective.calls if sent else 0.0
    return CommTime(collective, sent, intra, inter, latency)


def compute_seconds(work: Workload, rates: Rates) -> float:
    shape = work.shape
    flops = flops_per_token(work.n_params, shape.layers, shape.hidden_size, work.seq_len)
    if work.lora_r:  # frozen weights need no weight gradients: 2Ψ of the 6Ψ go
        flops -= 2 * (work.n_params - (work.trainable_params or 0))
    if work.activation_checkpointing:
        flops *= 4 / 3
    return flops * work.micro_batch * work.seq_len / rates.flops_per_s


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
    comms = [comm_time(c, hardware, rates) for c in collectives(info, work)] if hardware.world_size > 1 else []
    overlappable = sum(c.seconds for c in comms if c.collective.overlappable)
    hidden = min(rates.overlap * overlappable, compute)
    pcie, adam = offload_seconds(info, work, hardware, rates)
    terms = dict.fromkeys(TERMS, 0.0)
    terms["compute"] = compute
    for c in comms:
        terms[c.tier] += c.seconds
    terms["offload"] = pcie + adam
    tokens = work.micro_batch * work.seq_len * hardware.world_size
    return StepTime(compute, comms, hidden, pcie, adam, tokens, terms)

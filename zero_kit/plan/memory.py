"""Memory model per GPU and per host for every planned strategy (the registry's entries with `planned`), one
`Option` each; `zero_kit.plan.recommend` ranks them. Pure arithmetic: model states come from `zero_kit.plan.accounting` (the byte
tables shared with the benchmark), buckets from `zero_kit.config.builder.bucket_sizes`; nothing is launched.

Each term is a (bytes, formula) pair so the CLI can print the number beside how it was computed.
Stated constants (not measured on this machine, which has no GPU), `zero_kit.plan.assumptions` (--assume):
  CUDA context + NCCL communicators 1 GiB per GPU; allocator slack 5% of everything else;
  host baseline 2 GiB per rank (Python, torch, CUDA libraries); a safety margin of 10% of GPU memory (--margin).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zero_kit.config.builder import bucket_sizes
from zero_kit.plan.accounting import (
    DTYPE_BYTES,
    StateBytes,
    model_state_bytes,
    strategy_state_bytes,
    zero12_edge_grad_bytes,
)
from zero_kit.plan.assumptions import Assumptions
from zero_kit.plan.traffic import TierBytes, step_tier_bytes
from zero_kit.plan.workload import Workload
from zero_kit.strategies import STRATEGIES, StrategyInfo

GIB = 2**30
CUDA_CONTEXT_BYTES = 1 * GIB
ALLOCATOR_SLACK = 0.05
HOST_BASELINE_PER_RANK = 2 * GIB
CHECKPOINT_SHARD_BYTES = 5 * GIB  # HF checkpoints are saved in shards of at most ~5 GB
# The planner's options, in the order shown: the registry's planned entries.
PLANNED: tuple[StrategyInfo, ...] = tuple(info for info in STRATEGIES.values() if info.planned)


def offload_of(info: StrategyInfo) -> str:
    """The plan's word for what a strategy offloads: "none", "optimizer" or "optimizer+param"."""
    if info.offload_param:
        return "optimizer+param"
    return "optimizer" if info.offload_optimizer else "none"


@dataclass(frozen=True)
class Hardware:
    gpu_mem: int
    gpus_per_node: int = 1
    nodes: int = 1
    host_mem: int | None = None
    inter_node_gbps: float | None = None
    margin: float = 0.10
    assume: Assumptions = Assumptions()

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def usable_gpu_mem(self) -> int:
        return int(self.gpu_mem * (1 - self.margin))


Terms = dict[str, tuple[int, str]]


@dataclass
class Option:
    info: StrategyInfo
    states: Terms
    activations: Terms
    buffers: Terms
    host: Terms
    comm_bytes_per_step: int
    states_formula: str
    fits_gpu: bool = False
    fits_host: bool | None = None
    notes: list[str] = field(default_factory=list)
    timing: Any = None
    """`zero_kit.plan.timing.StepTime` when the plan predicts step times."""
    traffic: TierBytes = TierBytes()
    """Ring bytes per step, all ranks, by link tier (zero_kit.plan.traffic): what the slow-link ranking reads."""
    nodes: int = 1

    @property
    def strategy(self) -> str:
        """The byte-table row (ddp, fsdp, zero0..zero3): what the terms and the JSON's "strategy" are keyed on."""
        return self.info.accounting

    @property
    def offload(self) -> str:
        return offload_of(self.info)

    @property
    def label(self) -> str:
        suffix = {"none": "", "optimizer": "+opt-offload", "optimizer+param": "+opt+param-offload"}[self.offload]
        node = "" if self.info.hierarchy == "flat" else f"+{self.info.hierarchy.replace('_', '-')}"
        return self.strategy + node + suffix

    @property
    def inter_node_bytes_per_node(self) -> float:
        """Bytes each node sends over its inter-node link per step (0 on one node)."""
        return self.traffic.inter_node / self.nodes if self.nodes else 0.0

    def gpu_bytes(self) -> dict[str, int]:
        parts = {
            "model_states": _sum(self.states),
            "activations": _sum(self.activations),
            "buffers": _sum(self.buffers),
        }
        return {**parts, "total": sum(parts.values())}

    @property
    def host_bytes(self) -> int:
        return _sum(self.host)

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host is not False


def _sum(terms: Terms) -> int:
    return sum(value for value, _ in terms.values())


def activation_terms(work: Workload) -> Terms:
    """Bytes saved for backward per GPU (b micro batch, s sequence, h hidden, I intermediate, V vocab, L layers).

    Per layer, with SDPA/flash attention (no s^2 scores are stored): two RMSNorms keep an fp32 copy of their
    input plus the 16-bit normalised output (2 x (4 + a) bsh); q and the o_proj input (2 x a bsh) plus the
    attention output and its reshaped copy; k, v (2 x a bs h_kv); the shared projection inputs; the SwiGLU
    MLP keeps gate, silu(gate), up and their product (4 x a bsI). a = 2 bytes in bf16/fp16, 4 in fp32.
    With checkpointing only each layer's input (a bsh) is kept and one layer is recomputed at a time.
    The loss upcasts the logits to fp32 and keeps log-softmax and its gradient: bsV x (a + 4 + 4 + 4) (fp32: 12).
    """
    s = work.shape
    a = DTYPE_BYTES[work.precision]
    bs = work.micro_batch * work.seq_len
    h, inter, vocab, layers = s.hidden_size, s.intermediate_size, s.vocab_size, s.layers
    per_layer = bs * (2 * (4 + a) * h + 5 * a * h + 2 * a * s.kv_size + 4 * a * inter)
    layer_formula = f"bs[2(4+{a})h + {5 * a}h + {2 * a}h_kv + {4 * a}I]"
    logits_bytes = bs * vocab * (12 if a == 4 else a + 12)
    terms: Terms = {}
    if work.activation_checkpointing:
        terms["checkpointed layer inputs"] = (layers * bs * a * h, f"L x {a}bsh")
        terms["one layer recomputed"] = (per_layer, layer_formula)
    else:
        terms["saved activations, all layers"] = (layers * per_layer, f"L x {layer_formula}")
    # Gradients of activations flowing back through one layer are about as large as what it saved.
    terms["backward working set (one layer)"] = (per_layer, layer_formula)
    terms["logits + fp32 loss"] = (logits_bytes, f"bsV x {12 if a == 4 else a + 12}")
    return terms


def state_terms(strategy: str, offload: str, work: Workload, world_size: int) -> tuple[Terms, Terms, str]:
    """GPU and host model-state terms and the GPU total's formula of a byte-table row, from the shared tables."""
    states = model_state_bytes(
        strategy,
        work.n_params,
        world_size,
        work.precision,
        offload_optimizer=offload != "none",
        offload_param=offload == "optimizer+param",
        trainable_params=work.trainable_params,
    )
    return _state_terms(states)


def option_state_terms(info: StrategyInfo, work: Workload, hardware: Hardware) -> tuple[Terms, Terms, str]:
    """`state_terms` of a registry entry on this hardware (HSDP's node-sized shards, hpZ's secondary partition)."""
    states = strategy_state_bytes(
        info, work.n_params, hardware.world_size, hardware.gpus_per_node, work.precision, work.trainable_params
    )
    return _state_terms(states)


def _state_terms(states: StateBytes) -> tuple[Terms, Terms, str]:
    params_formula, grads_formula, optimizer_formula = states.part_formulas
    gpu = {
        "parameters": (states.params, params_formula),
        "gradients": (states.grads, grads_formula),
        "optimizer (master + Adam)": (states.optimizer, optimizer_formula),
    }
    host = {"offloaded states": (states.host_total, states.host_formula)} if states.host_total else {}
    return gpu, host, states.formula


def buffer_terms(
    strategy: str, offload: str, work: Workload, world_size: int, cuda_context: int = CUDA_CONTEXT_BYTES
) -> Terms:
    """Working buffers besides states and activations: buckets, gathered layers, CUDA context."""
    s = work.shape
    a = DTYPE_BYTES[work.precision]
    buckets = bucket_sizes(s.hidden_size)
    reduce_bucket = buckets["reduce_bucket_size"]
    terms: Terms = {"CUDA context + NCCL": (cuda_context, f"{cuda_context / GIB:g} GiB, stated")}
    trainable = work.trainable_params or work.n_params
    if strategy == "ddp":
        # zero_kit's DDP uses gradient_as_bucket_view=True, so the all-reduce buckets are the gradients themselves
        # (the default False would add a second 4Ψ copy). Autocast caches 16-bit copies of the fp32 weights.
        if a == 2 and not work.lora_r:  # LoRA's frozen base is already 16-bit
            terms["autocast weight cache"] = (2 * work.n_params, "2Ψ")
    elif strategy == "fsdp":
        root = s.vocab_size * s.hidden_size * (1 if s.tie_word_embeddings else 2)
        # The root (embeddings, lm_head) stays unsharded from forward to backward; blocks are gathered one
        # at a time with the next one prefetched; unsharded grads of one block wait for reduce-scatter.
        terms["root params + grads unsharded"] = (root * 2 * a, f"Vh x {2 * a}")
        terms["2 blocks gathered + 1 block grads"] = (3 * s.block_params * a, f"3 x block x {a}")
    elif strategy in ("zero0", "zero1", "zero2"):
        grad_bytes = 4 if strategy == "zero1" else a  # ZeRO-1 stages its bucket in fp32
        terms["reduce buckets (x2, overlap_comm)"] = (2 * reduce_bucket * grad_bytes, f"2 x h² x {grad_bytes}")
        if strategy != "zero0" and offload == "none" and not work.lora_r:
            # DeepSpeed keeps whole the gradients of parameters at its partition's edges (accounting.py)
            edge = max(zero12_edge_grad_bytes(s.param_numels(), world_size, work.precision))
            terms["edge params' whole grads"] = (edge, f"(max G_r - Ψ/N) x {a}")
        if offload != "none":
            # Gradients leave through two largest-parameter buffers; updated weights come back into a 16-bit
            # partition buffer (param_buffer_of_bit16_for_cpu_offload_groups in DeepSpeed 0.19.8).
            terms["offload staging (2 x largest param)"] = (2 * s.largest_layer_params * a, f"2 x largest layer x {a}")
            terms["16-bit partition for updated params"] = (a * -(-trainable // world_size), f"{a}Ψ/N")
    else:
        terms["largest layer gathered + grad"] = (s.largest_layer_params * 2 * a, f"largest layer x {2 * a}")
        terms["one block gathered"] = (s.block_params * a, f"block x {a}")
        terms["prefetch bucket"] = (buckets["stage3_prefetch_bucket_size"] * a, f"0.9h² x {a}")
        terms["reduce buckets (x2)"] = (2 * reduce_bucket * a, f"2 x h² x {a}")
        terms["persistent small params"] = ((2 * s.layers + 1) * s.hidden_size * a, f"(2L+1)h x {a}")
    return terms


def host_terms(strategy: str, offload_host: Terms, work: Workload, hardware: Hardware) -> Terms:
    """Host RAM per node: a baseline per rank plus the largest of three phases that never overlap: loading the
    model, training with offloaded states (pinned), and exporting (zero_to_fp32 holds the fp32 model, 4Ψ)."""
    a = DTYPE_BYTES[work.precision]
    ranks = hardware.gpus_per_node
    n = work.n_params
    baseline = hardware.assume.host_baseline_bytes
    terms: Terms = {"baseline per rank": (ranks * baseline, f"{ranks} x {baseline / GIB:g} GiB")}
    if strategy.startswith("zero3"):  # zero.Init partitions while loading: one shard plus each rank's partition
        load = (ranks * (a * n // hardware.world_size) + CHECKPOINT_SHARD_BYTES, f"{ranks} x {a}Ψ/N + 5 GiB shard")
    else:  # every rank materialises the whole 16-bit model before moving it to the GPU
        load = (ranks * a * n, f"{ranks} x {a}Ψ")
    phases = {"loading the model": load, "export to fp32 weights (zero_to_fp32)": (4 * n, "4Ψ")}
    if offload_host:
        formula = next(iter(offload_host.values()))[1]
        phases["offloaded states, pinned"] = (_sum(offload_host) * ranks, f"{ranks} x ({formula})")
    name = max(phases, key=lambda key: phases[key][0])
    terms[f"{name} (largest phase)"] = phases[name]
    return terms


def comm_bytes_per_step(strategy: str, work: Workload) -> int:
    """Bytes each rank sends per optimizer step (ring collectives, ignoring the (N-1)/N factor).

    DDP all-reduces fp32 gradients (2 x 4Ψ); ZeRO-0/1/2 move 16-bit gradients and parameters (reduce-scatter +
    all-gather = 2 x 2Ψ); ZeRO-3 gathers parameters twice (forward, backward) and reduce-scatters gradients
    (3 x 2Ψ); FSDP2 as zero_kit runs it reduces in fp32 (2Ψ + 2Ψ + 4Ψ). In fp32 every byte count is 4.
    The node-aware variants (hpZ, HSDP, reshard to the node) send their base's bytes over smaller groups (HSDP
    adds a small cross-node all-reduce of shards): what they change is where the bytes go (`Option.traffic`).
    """
    n = work.trainable_params or work.n_params
    gathered = work.n_params  # frozen LoRA weights are still gathered by ZeRO-3 / FSDP2
    a = DTYPE_BYTES[work.precision]
    match strategy:
        case "ddp":
            return 2 * 4 * n
        case "zero0" | "zero1" | "zero2":
            return 2 * a * n
        case "zero3":
            return 2 * a * gathered + a * n
        case "zero3_bf16":
            return 3 * 2 * n
        case "fsdp":
            return 2 * a * gathered + 4 * n
    raise ValueError(f"unknown strategy {strategy!r}")


def evaluate(info: StrategyInfo, work: Workload, hardware: Hardware) -> Option:
    strategy, offload = info.accounting, offload_of(info)
    gpu_states, offloaded, formula = option_state_terms(info, work, hardware)
    activations = activation_terms(work)
    assume = hardware.assume
    buffers = buffer_terms(strategy, offload, work, hardware.world_size, assume.cuda_context_bytes)
    if info.hierarchy == "reshard_node" and hardware.world_size > hardware.gpus_per_node:
        # every block keeps a node-sized shard from its forward to its backward (torch: the post-forward mesh;
        # one rank per node: reshard_after_forward=1 is False, the whole block stays gathered)
        a, blocks = DTYPE_BYTES[work.precision], work.shape.layers * work.shape.block_params
        kept = a * -(-blocks // hardware.gpus_per_node)
        buffers["blocks' node shards, forward to backward"] = (kept, f"{a} x L x block / N_node")
    slack_base = _sum(gpu_states) + _sum(activations) + _sum(buffers)
    slack = assume.allocator_slack
    buffers["allocator slack"] = (int(slack_base * slack), f"{slack:.0%} of the rest")
    option = Option(
        info,
        gpu_states,
        activations,
        buffers,
        host_terms(strategy, offloaded, work, hardware),
        comm_bytes_per_step(strategy, work),
        formula,
        traffic=step_tier_bytes(info, work, hardware.nodes, hardware.gpus_per_node),
        nodes=hardware.nodes,
    )
    option.fits_gpu = option.gpu_bytes()["total"] <= hardware.usable_gpu_mem
    if hardware.host_mem is not None:
        option.fits_host = option.host_bytes <= hardware.host_mem
    return option


def evaluate_all(work: Workload, hardware: Hardware) -> list[Option]:
    return [evaluate(info, work, hardware) for info in PLANNED]

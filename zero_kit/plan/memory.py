"""Memory model per GPU and per host for every planned strategy (the registry's entries with `planned`), one
`Option` each; `zero_kit.plan.recommend` ranks them. Pure arithmetic: model states come from `zero_kit.plan.accounting` (the byte
tables shared with the benchmark), buckets from `zero_kit.config.builder.bucket_sizes`; nothing is launched.

Each term is a (bytes, formula) pair so the CLI can print the number beside how it was computed.
Stated constants (not measured on this machine, which has no GPU) live in one place, `zero_kit.plan.assumptions`
(--assume): the CUDA context + NCCL communicators per GPU, the allocator slack, the host baseline per rank; besides
them a safety margin of GPU memory (--margin) and HF's checkpoint shard size below.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from zero_kit.config.builder import bucket_sizes, overlap_comm
from zero_kit.metrics import GIB
from zero_kit.plan.accounting import (
    DTYPE_BYTES,
    StateBytes,
    model_state_bytes,
    reference_bytes,
    strategy_state_bytes,
    zero12_edge_grad_bytes,
)
from zero_kit.plan.assumptions import Assumptions
from zero_kit.plan.parallel import Layout
from zero_kit.plan.traffic import TierBytes, step_tier_bytes, zero3_kept_params
from zero_kit.plan.workload import Workload
from zero_kit.strategies import STRATEGIES, StrategyInfo

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
    cpu_ranks: bool = False
    """The ranks train on CPU cores (the memory guard's CPU peak): ZeRO-1/2 then run without overlap_comm, as the
    generator writes their configs (zero_kit.config.builder.overlap_comm), and allocate one reduce bucket."""

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
    nodes: int = 1
    traffic: TierBytes = TierBytes()
    """Ring bytes per step, all ranks, by link tier (zero_kit.plan.traffic): what the slow-link ranking reads."""
    layout: Layout | None = None
    """Tensor/pipeline parallel layout (zero_kit.plan.parallel_options); None: data parallel alone."""
    # Filled in after construction: the fit against the hardware, the recommender's notes, the step time.
    fits_gpu: bool = False
    fits_host: bool | None = None
    notes: list[str] = field(default_factory=list)
    timing: Any = None
    """`zero_kit.plan.timing.StepTime` when the plan predicts step times."""

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
        return self.strategy + node + suffix + (self.layout.label if self.layout else "")

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


def _layer_saved(work: Workload, autocast: bool) -> tuple[int, str]:
    """Bytes one decoder layer saves for backward, as HF's LlamaDecoderLayer does with SDPA (no s^2 scores).

    16-bit weights (FSDP2, ZeRO) or fp32: each RMSNorm keeps its fp32 input, the normalised and the output
    tensor (2 x (4 + a) bsh); attention keeps q, its output and the o_proj input (4a bsh) and k, v (2a bs h_kv);
    SwiGLU keeps gate, silu(gate), up and their product (4a bsI). With autocast over fp32 weights (DDP in
    bf16/fp16) the residual stream stays fp32: both RMSNorms keep fp32 input and normalised tensors (16 bsh) and
    autocast casts each projection's input separately (7a bsh). Measured against autograd's saved tensors in
    tests/unit/test_plan.py and benchmarks/plan_memtracker/run.py."""
    s, a = work.shape, DTYPE_BYTES[work.precision]
    bs = work.rank_tokens  # b: sequences (two per DPO pair); s / sp under sequence parallelism
    # tiled: TiledMLP saves only its input (the norm's output, counted above) and recomputes the rest in backward
    mlp, kv = (0 if work.tiled else 4 * a * s.intermediate_size), 2 * a * s.kv_size
    if autocast:
        return bs * ((16 + 7 * a) * s.hidden_size + kv + mlp), f"bs[{16 + 7 * a}h + {2 * a}h_kv + {4 * a}I]"
    return bs * ((8 + 6 * a) * s.hidden_size + kv + mlp), f"bs[{8 + 6 * a}h + {2 * a}h_kv + {4 * a}I]"


def _peak_phases(work: Workload, strategy: str, autocast: bool) -> dict[str, Terms]:
    """What is alive on top of the saved activations and the model states in each moment that can be the peak.

    loss, forward: HF's ForCausalLMLoss (transformers/loss/loss_utils.py) upcasts the logits (a bsV) to fp32 (4)
    and log_softmax keeps its fp32 output (4); autocast still caches every fp32 weight's 16-bit copy (2Ψ): the
    cache (torch/amp/autocast_mode.py) is cleared only when the outermost autocast region exits.
    loss, backward: the 16-bit logits are gone (nothing saves them and the caller drops the output), log_softmax's
    output, its gradient and the input's gradient are fp32 (12 bsV); autocast's copies saved by the layers'
    matmuls (2Ψ; with checkpointing only lm_head's, the layers' are recomputed); FSDP2 has gathered the last block
    (backward prefetch, _fsdp_state.py _pre_backward).
    one layer, backward: that layer's recomputed activations (checkpointing) and its working set; FSDP2 holds
    lm_head's unsharded gradients until root_post_backward (_fsdp_state.py _root_post_backward_final_callback),
    two gathered blocks (current + prefetched) and one block's 16-bit gradients beside its fp32 reduce-scatter
    input (_fsdp_collectives.py foreach_reduce allocates it in reduce_dtype before freeing the gradients).
    """
    s, a = work.shape, DTYPE_BYTES[work.precision]
    bs = work.rank_tokens  # b: sequences (two per DPO pair); s / sp under sequence parallelism
    bsv = bs * s.vocab_size // work.slices  # tiled: one slice's logits at a time
    v = "bsV" if work.slices == 1 else f"bsV/{work.slices}"
    root = s.vocab_size * s.hidden_size * (1 if s.tie_word_embeddings else 2)
    layer, layer_formula = _layer_saved(work, autocast)
    forward: Terms = {
        "logits, fp32 copy, log-softmax": (bsv * (a + 8 if a < 4 else 8), f"{v} x {a + 8 if a < 4 else 8}")
    }
    backward: Terms = {"fp32 log-softmax + 2 gradients": (12 * bsv, f"{v} x 12")}
    one_layer: Terms = {"backward working set (one layer)": (layer, layer_formula)}
    if work.activation_checkpointing:
        one_layer["one layer recomputed"] = (layer, layer_formula)
    if work.tiled:  # one MLP slice recomputed with its gradients
        one_layer["one MLP slice recomputed"] = (bs * 4 * a * s.intermediate_size // work.slices, "bs/slices x 4aI")
    if autocast:
        forward["autocast weight cache"] = (2 * work.n_params, "2Ψ")
        backward["autocast copies saved"] = (
            (2 * root, "2 x lm_head") if work.activation_checkpointing else (2 * work.n_params, "2Ψ")
        )
        one_layer["autocast copies saved"] = (
            (2 * s.block_params, "2 x block") if work.activation_checkpointing else (2 * work.n_params, "2Ψ")
        )
    if strategy == "fsdp":
        backward["1 block gathered (prefetch)"] = (s.block_params * a, f"block x {a}")
        # lm_head's gradient only: an untied embedding's gradient is produced after the last block's backward
        one_layer["lm_head grads unsharded"] = (s.vocab_size * s.hidden_size * a, f"Vh x {a}")
        one_layer["2 blocks gathered + grads + fp32 reduce-scatter"] = (
            s.block_params * (3 * a + 4),
            f"block x {3 * a + 4}",
        )
    return {"loss, forward": forward, "loss, backward": backward, "one layer, backward": one_layer}


def activation_terms(work: Workload, strategy: str = "") -> Terms:
    """Bytes saved for backward per GPU plus what the peak moment adds (b micro batch, s sequence, h hidden,
    I intermediate, V vocab, L layers, Ψ parameters): all layers' saved activations, or with checkpointing each
    layer's input (a bsh; fp32 under autocast), the final RMSNorm and lm_head input (4 + 2a) bsh, and the largest
    of the phases in `_peak_phases`. The phases never overlap, so only the largest is charged (the planner used
    to add the loss's and one layer's working sets together, 5-27% above PyTorch's MemTracker/FSDPMemTracker)."""
    s, a = work.shape, DTYPE_BYTES[work.precision]
    autocast = strategy == "ddp" and a == 2 and not work.lora_r  # DDP keeps fp32 weights and runs under autocast
    bs = work.rank_tokens  # b: sequences (two per DPO pair); s / sp under sequence parallelism
    terms: Terms = {}
    if work.activation_checkpointing:
        residual = 4 if autocast else a
        terms["checkpointed layer inputs"] = (s.layers * bs * residual * s.hidden_size, f"L x {residual}bsh")
    else:
        layer, layer_formula = _layer_saved(work, autocast)
        terms["saved activations, all layers"] = (s.layers * layer, f"L x {layer_formula}")
    terms["final norm + lm_head input"] = (bs * (4 + 2 * a) * s.hidden_size, f"{4 + 2 * a}bsh")
    phases = _peak_phases(work, strategy, autocast)
    phase = max(phases, key=lambda name: _sum(phases[name]))
    terms |= {f"{name} (peak: {phase})": term for name, term in phases[phase].items()}
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
    strategy: str,
    offload: str,
    work: Workload,
    world_size: int,
    cuda_context: int | None = None,
    *,
    overlap: bool = True,
    zero_overrides: Mapping[str, Any] = MappingProxyType({}),
) -> Terms:
    """Working buffers besides states and activations: buckets, gathered layers, CUDA context (default: the
    stated `Assumptions().cuda_context_bytes`). Reduce buckets as DeepSpeed allocates them: ZeRO-1/2 two with
    overlap_comm (`overlap`), else one; ZeRO-3 one (stage3.py's ipg buffer, whatever overlap_comm says). ZeRO-3's
    gathered parameters: those it keeps from forward to backward (plan.traffic.zero3_kept_params of the strategy's
    `zero_overrides`), at least one block."""
    s = work.shape
    a = DTYPE_BYTES[work.precision]
    buckets = bucket_sizes(s.hidden_size)
    reduce_bucket = buckets["reduce_bucket_size"]
    if cuda_context is None:
        cuda_context = Assumptions().cuda_context_bytes
    terms: Terms = {"CUDA context + NCCL": (cuda_context, f"{cuda_context / GIB:g} GiB, stated")}
    trainable = work.trainable_params or work.n_params
    # DDP adds nothing here: zero_kit's DDP uses gradient_as_bucket_view=True, so the all-reduce buckets are the
    # gradients themselves (the default False would add a second 4Ψ copy), and autocast's 16-bit weight copies
    # are charged in the phase where they are alive (activation_terms).
    if strategy == "fsdp":
        root = s.vocab_size * s.hidden_size * (1 if s.tie_word_embeddings else 2)
        # The root (embeddings, lm_head) is not resharded after forward (_fsdp_state.py: the root's
        # post_forward_mesh_info is None), so it stays gathered from forward to backward; gathered blocks and
        # unsharded gradients belong to one moment of the step and are charged there (activation_terms).
        terms["root params unsharded"] = (root * a, f"Vh x {a}" if s.tie_word_embeddings else f"2Vh x {a}")
    elif strategy in ("zero0", "zero1", "zero2"):
        grad_bytes = 4 if strategy == "zero1" else a  # ZeRO-1 stages its bucket in fp32
        if overlap:
            terms["reduce buckets (x2, overlap_comm)"] = (2 * reduce_bucket * grad_bytes, f"2 x 25h² x {grad_bytes}")
        else:
            terms["reduce bucket"] = (reduce_bucket * grad_bytes, f"25h² x {grad_bytes}")
        if strategy != "zero0" and offload == "none" and not work.lora_r:
            # DeepSpeed keeps whole the gradients of parameters at its partition's edges (accounting.py)
            edge = max(zero12_edge_grad_bytes(s.param_numels(), world_size, work.precision))
            terms["edge params' whole grads"] = (edge, f"(max G_r - Ψ/N) x {a}")
        if offload != "none":
            # Gradients leave through two largest-parameter buffers; updated weights come back into a 16-bit
            # partition buffer (param_buffer_of_bit16_for_cpu_offload_groups in DeepSpeed 0.19.8).
            terms["offload staging (2 x largest param)"] = (2 * s.largest_layer_params * a, f"2 x largest layer x {a}")
            terms["16-bit partition for updated params"] = (a * -(-trainable // world_size), f"{a}Ψ/N")
    elif strategy != "ddp":
        terms |= _zero3_buffers(work, buckets, zero3_kept_params(zero_overrides, work.n_params))
    return terms


def _zero3_buffers(work: Workload, buckets: dict[str, int], kept: int) -> Terms:
    """ZeRO-3's working buffers, `kept` parameters staying gathered from forward to backward."""
    s, a = work.shape, DTYPE_BYTES[work.precision]
    terms: Terms = {}
    if kept >= work.n_params:  # every parameter stays gathered, the largest layer among them: its gradient
        terms["largest layer's grad"] = (s.largest_layer_params * a, f"largest layer x {a}")
    else:
        terms["largest layer gathered + grad"] = (s.largest_layer_params * 2 * a, f"largest layer x {2 * a}")
    if kept > s.block_params:
        terms["params kept gathered, fwd to bwd"] = (kept * a, f"min(Ψ, reuse/2) x {a}")
    else:
        terms["one block gathered"] = (s.block_params * a, f"block x {a}")
    terms["prefetch bucket"] = (buckets["stage3_prefetch_bucket_size"] * a, f"0.9h² x {a}")
    terms["reduce bucket"] = (buckets["reduce_bucket_size"] * a, f"25h² x {a}")
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
    # DPO's frozen reference (LoRA's is the same weights, adapter off; none once its log-probabilities are precomputed)
    if work.preference and not work.lora_r and not work.reference_precomputed:
        reference = reference_bytes(strategy, work.n_params, hardware.world_size, work.precision)
        (offloaded if offload == "optimizer+param" else gpu_states)["DPO reference (frozen)"] = reference
    activations = activation_terms(work, strategy)
    assume = hardware.assume
    overlap = overlap_comm(info.stage, "cpu" if hardware.cpu_ranks else "cuda")
    buffers = buffer_terms(
        strategy,
        offload,
        work,
        hardware.world_size,
        assume.cuda_context_bytes,
        overlap=overlap,
        zero_overrides=info.zero_overrides,
    )
    if info.hierarchy == "reshard_node" and hardware.world_size > hardware.gpus_per_node:
        # every block keeps a node-sized shard from its forward to its backward (torch: the post-forward mesh;
        # one rank per node: reshard_after_forward=1 is False, the whole block stays gathered)
        a, blocks = DTYPE_BYTES[work.precision], work.shape.layers * work.shape.block_params
        kept = a * -(-blocks // hardware.gpus_per_node)
        buffers["blocks' node shards, forward to backward"] = (kept, f"{a} x L x block / N_node")
    slack_base = _sum(gpu_states) + _sum(activations) + _sum(buffers)
    slack = assume.zero_allocator_slack if info.backend == "deepspeed" and info.stage >= 1 else assume.allocator_slack
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

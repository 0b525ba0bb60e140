"""Bytes per parameter: the ONE place that says how many bytes of parameters, gradients and optimizer
state each rank holds, per strategy and precision. `zero-kit plan` and the benchmark's accounting both
call `model_state_bytes`, so a prediction and a measurement are always compared against the same formula.

Ψ is the parameter count, N the data-parallel world size. Mixed precision (bf16/fp16) follows the ZeRO
paper's Adam accounting as DeepSpeed 0.19.8 really allocates it; its own estimators
(`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`) give the same totals:

    ZeRO-2: 2Ψ (16-bit params) + 18Ψ/N (2 16-bit grads + 4 fp32 grads + 4 fp32 master + 8 Adam m, v)
    ZeRO-3: 18Ψ/N (2 params + 2 grads + 12 optimizer, all partitioned, + 2 for the fp32 gradient copy that
            exists for one optimizer sub-group at a time: DeepSpeed's estimator charges it 2Ψ/N)

fp32 is what the backends keep when nothing is 16-bit, measured on 2 CPU ranks (gloo) with the tiny LLaMA:
DeepSpeed still keeps a separate fp32 master partition, so ZeRO-3 fp32 is 20Ψ/N, not 16Ψ/N (storages by owner:
`python -m benchmarks.state_bytes.run --list-storages`; stage3.py `_create_fp32_partitions` would reuse the parameter
partition only when `tensor.device == self.device`, but self.device is the string "cpu" / "cuda:0", never equal to
a torch.device, so it always clones), and ZeRO-1 in 0.19.8 accumulates gradients straight into an fp32 partition,
exactly like ZeRO-2. DDP and FSDP2 train in
fp32 parameters (autocast for bf16/fp16), so their states are 4 + 4 + 8 bytes per parameter, replicated
(DDP) or sharded (FSDP2). Bucket and gathered-layer buffers are not model states: see `zero_kit.plan.memory`.

Low-precision states (row zero3_bf16: `bf16_master_weights_and_grads` + `bf16_optimizer_states` under
`torch_autocast` bf16, DeepSpeed's documented pair): bf16 parameters, gradients, master and both Adam moments,
2 + 2 + 2 + 4 = 10Ψ/N at ZeRO-3 in every run precision (bf16 is switched on by the strategy), measured on 4 CPU
ranks: params 2Ψ/N, grads 2Ψ/N, optimizer 6Ψ/N.

Node-aware layouts (zero_kit.strategies.StrategyInfo.hierarchy; L ranks per node): HSDP shards every state over
the L ranks of a node instead of all N (the caller passes world_size = L, `partition_symbol="N_node"`); hpZ adds a
secondary parameter partition over the node, aΨ/L in the parameters' dtype (`secondary_ranks`), which lives
from a parameter's first release after use until the optimizer step (measured at the end of backward).

One more thing DeepSpeed really keeps: ZeRO-1/2 hold the gradients of the parameters at the edges of their
partition whole (`zero12_grad_partition_elements`), so rank r's gradient partition is G_r >= Ψ/N elements. The
benchmark predicts each rank exactly with it; the planner counts the largest excess as a buffer, which keeps
`model_state_bytes` equal to DeepSpeed's estimators (which ignore it). For Llama-3-8B at N = 8 the excess is at
most 8.6% of the gradient partition (two whole MLP matrices); for a tiny model on 4 ranks it is up to 50%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

# The table's rows. Strategy names map onto them in the registry (zero_kit.strategies: StrategyInfo.accounting).
ROWS = ("ddp", "fsdp", "zero0", "zero1", "zero2", "zero3", "zero3_bf16")
PRECISIONS = ("bf16", "fp16", "fp32")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
FP32 = 4
ADAM_MOMENTS = 8  # exp_avg + exp_avg_sq, always fp32


@dataclass(frozen=True)
class StateBytes:
    """Per-rank bytes of model states. `params`/`grads`/`optimizer` live on the accelerator; `host_*` are the
    parts offloaded to CPU RAM (zero when nothing is offloaded). Optimizer includes the fp32 master copy.
    Predictions carry their formulas; a measurement (the benchmark's record) has none."""

    params: int
    grads: int
    optimizer: int
    host_params: int = 0
    host_grads: int = 0
    host_optimizer: int = 0
    formula: str = ""
    host_formula: str = ""
    part_formulas: tuple[str, ...] = ("", "", "")
    """Formulas of params, grads and optimizer, in that order."""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def host_total(self) -> int:
        return self.host_params + self.host_grads + self.host_optimizer

    @property
    def all_bytes(self) -> int:
        """Accelerator plus host: what a CPU-only run (where both are RAM) measures."""
        return self.total + self.host_total

    def as_dict(self) -> dict[str, int]:
        """The accelerator parts and their total (the benchmark record's keys); host parts only when there are any."""
        parts = {"params": self.params, "grads": self.grads, "optimizer": self.optimizer, "total": self.total}
        if self.host_total:
            host = {"params": self.host_params, "grads": self.host_grads, "optimizer": self.host_optimizer}
            parts |= {f"host_{key}": value for key, value in host.items()} | {"host_total": self.host_total}
        return parts


@dataclass(frozen=True)
class Coefficients:
    """Bytes per parameter of each state: (replicated on every rank, partitioned over N)."""

    params: tuple[int, int]
    grads: tuple[int, int]
    optimizer: tuple[int, int]


def coefficients(strategy: str, precision: str) -> Coefficients:
    """The byte table: one row per strategy, for 16-bit mixed precision or fp32."""
    _check_row(strategy, precision)
    low = DTYPE_BYTES[precision]
    master_and_moments = FP32 + ADAM_MOMENTS  # DeepSpeed keeps an fp32 master even when params are fp32 (ZeRO-3 too)
    # fp32: gradients accumulate in one fp32 partition. 16-bit: the reduced 16-bit partition, plus the fp32 copy
    # the optimizer steps on (DeepSpeed's estimator charges 4Ψ/N for it at ZeRO-1/2 and 2Ψ/N at ZeRO-3, where it
    # exists for one optimizer sub-group at a time).
    sharded_grads = FP32 if precision == "fp32" else low + FP32
    zero3_grads = FP32 if precision == "fp32" else low + 2
    match strategy:
        case "ddp":
            return Coefficients((FP32, 0), (FP32, 0), (ADAM_MOMENTS, 0))
        case "fsdp":
            return Coefficients((0, FP32), (0, FP32), (0, ADAM_MOMENTS))
        case "zero0":
            if precision == "fp32":  # DeepSpeed hands the plain torch optimizer the fp32 params
                return Coefficients((FP32, 0), (FP32, 0), (ADAM_MOMENTS, 0))
            # BF16_Optimizer / FP16_Optimizer: 16-bit params and grads, fp32 master + moments
            return Coefficients((low, 0), (low, 0), (master_and_moments, 0))
        case "zero1" | "zero2":
            return Coefficients((low, 0), (0, sharded_grads), (0, master_and_moments))
        case "zero3":
            return Coefficients((0, low), (0, zero3_grads), (0, master_and_moments))
        case "zero3_bf16":  # bf16 whatever the run's precision: params, grads, master, exp_avg, exp_avg_sq
            bf16 = DTYPE_BYTES["bf16"]
            return Coefficients((0, bf16), (0, bf16), (0, 3 * bf16))
    raise AssertionError(strategy)  # _check_row already refused it


def _check_row(strategy: str, precision: str) -> None:
    if strategy not in ROWS:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {list(ROWS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {list(PRECISIONS)}")


def _per_rank(pair: tuple[int, int], n_params: int, world_size: int) -> int:
    replicated, partitioned = pair
    # DeepSpeed pads each partition up to a multiple of N; ceil keeps the prediction on the safe side.
    return replicated * n_params + partitioned * -(-n_params // world_size)


def model_state_bytes(
    strategy: str,
    n_params: int,
    world_size: int,
    precision: str,
    *,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    trainable_params: int | None = None,
    secondary_ranks: int | None = None,
    partition_symbol: str = "N",
) -> StateBytes:
    """Per-rank bytes of parameters, gradients and optimizer state for one strategy.

    Offloading the optimizer (ZeRO-1/2/3) moves the fp32 gradient partition, master and Adam moments to host RAM
    (ZeRO-3 also its gradient accumulation partition); gradients leave the GPU bucket by bucket, so only buckets
    stay there (counted as buffers by `zero_kit.plan.memory`).
    Offloading parameters (ZeRO-3) moves the 16-bit parameter partition too. With `trainable_params`
    (LoRA), the other parameters are frozen: they keep only their weights (16-bit under mixed precision),
    partitioned by ZeRO-3 and FSDP2, and only the trainable ones carry gradients and optimizer state.
    `secondary_ranks` (hpZ): a second parameter partition over that many ranks; `partition_symbol` names the
    sharding group in the formulas ("N_node" when the caller shards over one node's ranks, HSDP).
    """
    trainable = _checked_trainable(strategy, n_params, world_size, offload_optimizer, offload_param, trainable_params)
    table = coefficients(strategy, precision)
    frozen = n_params - trainable
    frozen_pair = _frozen_pair(strategy, precision)

    on_gpu = [
        _per_rank(table.params, trainable, world_size) + _per_rank(frozen_pair, frozen, world_size),
        _per_rank(table.grads, trainable, world_size),
        _per_rank(table.optimizer, trainable, world_size),
    ]
    offload = (offload_optimizer, offload_param)
    gpu, host, host_pairs = _offloaded(on_gpu, table, strategy, precision, trainable, world_size, *offload)
    gpu_pairs = _gpu_pairs(table, offload_optimizer, offload_param)
    lora = trainable_params is not None
    states = StateBytes(
        params=gpu[0],
        grads=gpu[1],
        optimizer=gpu[2],
        formula=_formula(gpu_pairs, frozen_pair if not offload_param else (0, 0), lora),
        host_params=host[0],
        host_grads=host[1],
        host_optimizer=host[2],
        host_formula=_formula(host_pairs, frozen_pair if offload_param else (0, 0), lora) if any(host) else "",
        part_formulas=tuple(
            _formula([pair], frozen_pair if i == 0 else (0, 0), lora) for i, pair in enumerate(gpu_pairs)
        ),
    )
    if secondary_ranks:
        states = _with_secondary(states, n_params, secondary_ranks, precision, strategy)
    return _renamed_partition(states, partition_symbol) if partition_symbol != "N" else states


def _offloaded(
    on_gpu: list[int],
    table: Coefficients,
    strategy: str,
    precision: str,
    trainable: int,
    world_size: int,
    offload_optimizer: bool,
    offload_param: bool,
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """(GPU bytes, host bytes, host coefficient pairs) of parameters, gradients and optimizer after offloading."""
    gpu, host, host_pairs = list(on_gpu), [0, 0, 0], [(0, 0), (0, 0), (0, 0)]
    if offload_optimizer:
        # The host keeps the fp32 gradient partition CPU Adam steps on; ZeRO-3 also keeps its gradient
        # accumulation partition there (measured: fp32 ZeRO-3 offload holds 24Ψ/N in all, ZeRO-2 4Ψ + 20Ψ/N with
        # the 16-bit partition buffer that `zero_kit.plan.memory` counts as a GPU buffer).
        host_grads = (0, FP32 + DTYPE_BYTES[precision]) if strategy == "zero3" else (0, FP32)
        host = [0, _per_rank(host_grads, trainable, world_size), gpu[2]]
        host_pairs = [(0, 0), host_grads, table.optimizer]
        gpu[1], gpu[2] = 0, 0
    if offload_param:
        host[0], gpu[0] = gpu[0], 0
        host_pairs[0] = table.params
    return gpu, host, host_pairs


def _checked_trainable(
    strategy: str,
    n_params: int,
    world_size: int,
    offload_optimizer: bool,
    offload_param: bool,
    trainable_params: int | None,
) -> int:
    """The trainable parameter count, after refusing arguments no strategy can mean (ValueError says which)."""
    if world_size < 1 or n_params < 0:
        raise ValueError(f"need world_size >= 1 and n_params >= 0, got {world_size}, {n_params}")
    if offload_param and (strategy != "zero3" or not offload_optimizer):
        raise ValueError("parameter offload needs zero3 with optimizer offload")
    if offload_optimizer and strategy not in ("zero1", "zero2", "zero3"):
        raise ValueError(f"optimizer offload needs ZeRO-1/2/3, not {strategy}")
    trainable = n_params if trainable_params is None else trainable_params
    if not 0 <= trainable <= n_params:
        raise ValueError(f"trainable_params {trainable} must be between 0 and n_params {n_params}")
    return trainable


def _renamed_partition(states: StateBytes, symbol: str) -> StateBytes:
    """The formulas with the sharding group written `symbol` instead of N (e.g. "N_node" for HSDP)."""
    rename = lambda text: text.replace("/N", f"/{symbol}")  # noqa: E731
    return replace(states, formula=rename(states.formula), host_formula=rename(states.host_formula),
                   part_formulas=tuple(rename(f) for f in states.part_formulas))  # fmt: skip


def _with_secondary(states: StateBytes, n_params: int, ranks: int, precision: str, strategy: str) -> StateBytes:
    """hpZ: the secondary 16-bit (fp32 in an fp32 run) partition of every parameter over `ranks` ranks."""
    if strategy != "zero3" or states.host_params:
        raise ValueError(f"a secondary parameter partition (hpZ) needs zero3 without parameter offload, not {strategy}")
    a = DTYPE_BYTES[precision]
    extra, term = a * -(-n_params // ranks), f"{a}Ψ/N_node"
    params_formula = f"{states.part_formulas[0]} + {term}"
    return replace(states, params=states.params + extra, formula=f"{states.formula} + {term}",
                   part_formulas=(params_formula, *states.part_formulas[1:]))  # fmt: skip


ZERO12_ALIGNMENT = 2  # stage_1_and_2.py nccl_start_alignment_factor: the flat group is padded to a multiple of 2N


def reference_bytes(strategy: str, n_params: int, world_size: int, precision: str) -> tuple[int, str]:
    """(bytes per rank, formula) of a frozen DPO reference model: its weights in the run's parameter dtype and
    nothing else (TRL prepares it without an optimizer and runs it under no_grad). Partitioned over the ranks at
    ZeRO-3 (and by FSDP); whole on every rank otherwise: TRL prepares it at ZeRO stage 0 under ZeRO-1/2, whose
    shards (optimizer states, gradients) a frozen model has none of."""
    a = DTYPE_BYTES[precision]
    if strategy.startswith("zero3") or strategy == "fsdp":
        return -(-a * n_params // world_size), f"{a}Ψ/N"
    return a * n_params, f"{a}Ψ"


def zero12_grad_partition_elements(numels: Sequence[int], world_size: int) -> list[int]:
    """Per rank, the elements of DeepSpeed ZeRO-1/2's gradient partition (`grads_in_partition`, 0.19.8).

    The group's parameters are flattened in order and cut into N equal partitions, but a rank keeps the
    gradient of every parameter that starts in its partition or straddles into it WHOLE (`get_partition_info`
    + `copy_grads_in_partition` sum `param.numel()`). So rank r holds G_r >= Ψ/N elements; the excess is less
    than two parameters, which matters when single parameters are large next to Ψ/N (embeddings, small N·Ψ).
    The paper's 4Ψ/N (fp32) is the limit of 4·G_r when every parameter is small next to a partition."""
    if world_size < 1:
        raise ValueError(f"need world_size >= 1, got {world_size}")
    unit = ZERO12_ALIGNMENT * world_size
    partition = -(-sum(numels) // unit) * unit // world_size
    held = []
    for rank in range(world_size):
        start, end, index, total = rank * partition, (rank + 1) * partition, 0, 0
        for numel in numels:
            if start <= index < end or index < start < index + numel:
                total += numel
            index += numel
        held.append(total)
    return held


def zero12_edge_grad_bytes(numels: Sequence[int], world_size: int, precision: str) -> list[int]:
    """Per rank, the gradient bytes ZeRO-1/2 holds beyond `model_state_bytes`' share (whole edge parameters):
    (G_r - ceil(Ψ/N)) x the gradient dtype (the model's dtype: fp32, or 16-bit under mixed precision)."""
    share = -(-sum(numels) // world_size)
    return [(g - share) * DTYPE_BYTES[precision] for g in zero12_grad_partition_elements(numels, world_size)]


def _frozen_pair(strategy: str, precision: str) -> tuple[int, int]:
    """Bytes per frozen (LoRA base) parameter: the weight only, in the compute dtype, sharded where params are."""
    weight = DTYPE_BYTES[precision]
    return (0, weight) if strategy in ("zero3", "zero3_bf16", "fsdp") else (weight, 0)


def _gpu_pairs(table: Coefficients, offload_optimizer: bool, offload_param: bool) -> list[tuple[int, int]]:
    pairs = [table.params, table.grads, table.optimizer]
    if offload_optimizer:
        pairs[1], pairs[2] = (0, 0), (0, 0)
    if offload_param:
        pairs[0] = (0, 0)
    return pairs


def _terms(replicated: int, partitioned: int, symbol: str) -> list[str]:
    return [t for c, t in ((replicated, f"{replicated}{symbol}"), (partitioned, f"{partitioned}{symbol}/N")) if c]


def _formula(pairs: list[tuple[int, int]], frozen_pair: tuple[int, int], lora: bool) -> str:
    """ "2Ψ + 18Ψ/N"; with LoRA the frozen (Ψf) and trainable (Ψt) parameters are written apart."""
    replicated, partitioned = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    if not lora:
        return " + ".join(_terms(replicated, partitioned, "Ψ")) or "0"
    parts = _terms(*frozen_pair, "Ψf") + _terms(replicated, partitioned, "Ψt")
    return " + ".join(parts) or "0"


def strategy_state_bytes(
    info, n_params: int, world_size: int, ranks_per_node: int, precision: str, trainable_params: int | None = None
) -> StateBytes:
    """`model_state_bytes` for a registry entry (zero_kit.strategies.StrategyInfo) on N ranks of L per node: its
    byte-table row, offload, HSDP's node-sized sharding and hpZ's secondary partition. The planner and the
    benchmark's report both predict through here."""
    shards = info.state_shards(world_size, ranks_per_node)
    return model_state_bytes(
        info.accounting,
        n_params,
        shards,
        precision,
        offload_optimizer=info.offload_optimizer,
        offload_param=info.offload_param,
        trainable_params=trainable_params,
        secondary_ranks=info.secondary_ranks(world_size, ranks_per_node),
        partition_symbol="N_node" if shards != world_size else "N",
    )

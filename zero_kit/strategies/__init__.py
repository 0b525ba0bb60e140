"""The registry of training strategies: the ONE place a strategy name is defined. Each entry says which backend
builds it, which launcher starts it, its ZeRO stage and offload, the DeepSpeed knobs it changes, and which row of
the byte tables (`zero_kit.plan.accounting`) predicts its memory. The benchmark (launcher choice, DeepSpeed
overrides, predicted bytes) and `zero-kit plan` (its options, the stage `-o` writes) read everything from here, so
a new strategy needs an entry here and nothing else beyond its backend. A user's own DeepSpeed config in the
benchmark (`--ds-config`) is no entry: `user_config_info` makes its StrategyInfo from the file's stage and offload.

Backends live in ddp.py, fsdp.py and deepspeed.py behind the interface of base.py and share nothing else. This
module imports neither torch nor deepspeed: the planner and the CLI import it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from types import MappingProxyType

from zero_kit.errors import UserError, raise_all
from zero_kit.strategies.base import Strategy, StrategyOptions

__all__ = [
    "SP_SUFFIX",
    "STRATEGIES",
    "Strategy",
    "StrategyInfo",
    "StrategyOptions",
    "USER_CONFIG",
    "build_strategy",
    "check_model_parallel",
    "check_name",
    "sequence_parallel_name",
    "strategy_info",
    "is_user_config",
    "user_config_info",
    "user_config_name",
]


@dataclass(frozen=True)
class StrategyInfo:
    name: str
    """What users type: `zero-kit bench --strategies NAME`, and the key of STRATEGIES."""
    backend: str
    """The module that builds it: "ddp", "fsdp", "deepspeed" or "pipeline" (see `build_strategy`)."""
    launcher: str
    """The launcher its ranks need: "torchrun" or "deepspeed"."""
    stage: int
    """ZeRO stage. For DDP and FSDP2, the stage that shards the same states (0, 3): what `plan -o` writes."""
    accounting: str
    """Row of the byte tables that predicts its model states: ddp, fsdp, zero0..zero3 or zero3_bf16."""
    offload_optimizer: bool = False
    """Optimizer states (fp32 master, Adam moments, fp32 gradients) live in host RAM (CPU Adam steps them)."""
    offload_param: bool = False
    """The 16-bit parameter partition lives in host RAM too (ZeRO-3 only)."""
    zero_overrides: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    """Keys merged into the generated config's "zero_optimization" section."""
    planned: bool = True
    """An option of `zero-kit plan`. Variants that change only a communication knob have their base's bytes."""
    benchable: bool = True
    """The benchmark's backend can run it (False: planned only)."""
    hierarchy: str = "flat"
    """How its groups follow the nodes. flat: every collective spans all ranks. hpz: DeepSpeed ZeRO++ hpZ
    (zero_hpz_partition_size = ranks per node): a second 16-bit parameter partition over the ranks of one node,
    made when a parameter is released after use, so re-gathers until the optimizer step stay inside the node.
    hsdp: FSDP2 on a 2D mesh (nodes x ranks per node): states sharded inside a node, replicated across nodes,
    gradients all-reduced across nodes. reshard_node: FSDP2 `reshard_after_forward=<ranks per node>`: after
    forward each block keeps a node-sized shard, so the backward all-gather stays inside the node."""
    low_precision_states: bool = False
    """DeepSpeed keeps master weights, gradients and Adam moments in bf16 (`bf16_master_weights_and_grads`,
    `bf16_optimizer_states`) and computes under `torch_autocast` bf16, whatever the run's precision."""
    tensor_parallel: int = 1
    """Ranks that split every layer's matmuls (DeepSpeed AutoTP, `tensor_parallel.autotp_size`). DeepSpeed's mesh
    is (data parallel, tensor parallel): consecutive ranks form a TP group, so on whole nodes it stays inside one."""
    pipeline_stages: int = 1
    """Ranks that each hold a contiguous share of the layers (torch.distributed.pipelining), consecutive ranks
    forming one pipeline. With either degree above 1 the byte-table row applies to the parameters one rank holds,
    and its states are sharded over the data-parallel ranks only (world / model_parallel)."""

    sequence_parallel: int = 1
    """Ranks that share every row, each holding 1/N of its tokens and exchanging attention heads all-to-all in every
    layer (DeepSpeed's Ulysses, `sequence_parallel_size`): the `_spN` variant of a ZeRO entry
    (`sequence_parallel_name`). DeepSpeed groups consecutive ranks; ZeRO partitions over every rank."""

    @property
    def model_parallel(self) -> int:
        """Ranks one model replica spans: tensor_parallel x pipeline_stages."""
        return self.tensor_parallel * self.pipeline_stages

    def state_shards(self, world_size: int, ranks_per_node: int) -> int:
        """Ranks the model states are sharded over: one node's ranks under HSDP, else the data-parallel ranks."""
        return min(ranks_per_node, world_size) if self.hierarchy == "hsdp" else world_size // self.model_parallel

    def secondary_ranks(self, world_size: int, ranks_per_node: int) -> int | None:
        """Ranks of hpZ's secondary parameter partition (None: no secondary partition). DeepSpeed makes none when
        one node holds every rank (zero_hpz_partition_size >= N is plain ZeRO-3)."""
        if self.hierarchy != "hpz" or ranks_per_node >= world_size or ranks_per_node < 2:
            return None
        return ranks_per_node


def _native(name: str, stage: int, *, backend: str | None = None, hierarchy: str = "flat") -> StrategyInfo:
    backend = backend or name
    return StrategyInfo(
        name, backend=backend, launcher="torchrun", stage=stage, accounting=backend, hierarchy=hierarchy
    )


def _pipeline(name: str, stages: int) -> StrategyInfo:
    # Each stage is a plain replica of its layers (fp32 params, grads, AdamW): the ddp row over the stage's share.
    return StrategyInfo(
        name, backend="pipeline", launcher="torchrun", stage=0, accounting="ddp", pipeline_stages=stages, planned=False
    )


def _zero(
    name: str,
    stage: int,
    *,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    overrides: dict[str, object] | None = None,
    planned: bool = True,
    benchable: bool = True,
    hierarchy: str = "flat",
    low_precision_states: bool = False,
    tensor_parallel: int = 1,
) -> StrategyInfo:
    return StrategyInfo(
        name,
        backend="deepspeed",
        launcher="deepspeed",
        stage=stage,
        accounting=f"zero{stage}" + ("_bf16" if low_precision_states else ""),
        hierarchy=hierarchy,
        low_precision_states=low_precision_states,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        zero_overrides=MappingProxyType(overrides or {}),
        planned=planned,
        benchable=benchable,
        tensor_parallel=tensor_parallel,
    )


_RELEASE = {"stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 0, "stage3_prefetch_bucket_size": 0}

_ENTRIES = (
    _native("ddp", stage=0),
    _native("fsdp", stage=3),
    # Hierarchical FSDP2 (see StrategyInfo.hierarchy): the node is the ranks per node of the run / the plan.
    _native("fsdp_hsdp", stage=3, backend="fsdp", hierarchy="hsdp"),
    _native("fsdp_reshard_node", stage=3, backend="fsdp", hierarchy="reshard_node"),
    _zero("zero0", 0),
    _zero("zero1", 1),
    _zero("zero2", 2),
    _zero("zero3", 3),
    _zero("zero3_hpz", 3, hierarchy="hpz"),
    _zero("zero3_bf16states", 3, low_precision_states=True),
    _zero("zero2_offload", 2, offload_optimizer=True),
    _zero("zero3_offload", 3, offload_optimizer=True),
    # The bench's DeepSpeedStrategy has no parameter offload (it reads ZeRO-3's partitions where they are on the
    # device and was never measured offloaded), so only the planner offers it: the last resort before refusing.
    _zero("zero3_offload_param", 3, offload_optimizer=True, offload_param=True, benchable=False),
    # Variants that change one DeepSpeed knob to show where its traffic differs from the ZeRO paper:
    # zero{1,2}_reduce: per-owner reduce instead of DeepSpeed's default all-reduce of whole buckets;
    # zero3_release: no reuse distance, live-parameter budget or prefetch, so every parameter is freed after its
    # forward use and re-gathered for backward (the ZeRO paper's 3Ψ traffic).
    _zero("zero1_reduce", 1, planned=False, overrides={"use_multi_rank_bucket_allreduce": False}),
    _zero("zero2_reduce", 2, planned=False, overrides={"use_multi_rank_bucket_allreduce": False}),
    _zero("zero3_release", 3, planned=False, overrides=_RELEASE),
    # hpZ where it matters on a small model: parameters released after forward are re-gathered in backward from
    # the node's secondary partition (zero3_hpz on the generator's config re-gathers only what outlives its
    # live-parameter budget: nothing on the benchmark's tiny models, most of an 8B model).
    _zero("zero3_hpz_release", 3, planned=False, overrides=_RELEASE, hierarchy="hpz"),
    # Model parallelism beside data parallelism (benchmark only until the planner models them): DeepSpeed AutoTP
    # 2-way with ZeRO-1 (ZeRO partitions over the data-parallel ranks), and a 2-stage 1F1B pipeline.
    _zero("zero1_tp", 1, planned=False, tensor_parallel=2),
    _pipeline("pp", 2),
)
STRATEGIES: Mapping[str, StrategyInfo] = MappingProxyType({info.name: info for info in _ENTRIES})


USER_CONFIG = "ds_config"
"""A user's own DeepSpeed config in the benchmark (`zero-kit bench --ds-config FILE`), as the row
`ds_config:<file stem>`. Not an entry of STRATEGIES: its facts are the file's (`user_config_info`)."""


def user_config_name(path: str) -> str:
    """The bench row of the config file `path`: `ds_config:<its stem>` (characters other than letters, digits, `.`,
    `_` and `-` become `_`: the name is also a log file's and a launcher argument)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", PurePath(path).stem) or "file"
    return f"{USER_CONFIG}:{stem}"


def is_user_config(name: str) -> bool:
    """Whether `name` is the row of a user's own config (`ds_config` or `ds_config:<stem>`)."""
    return name == USER_CONFIG or name.startswith(USER_CONFIG + ":")


def user_config_info(
    name: str,
    stage: int,
    *,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    low_precision_states: bool = False,
    hpz: bool = False,
    zero: Mapping[str, object] | None = None,
) -> StrategyInfo:
    """The registry entry of a user's own config: DeepSpeed at the file's ZeRO stage and offload, predicted by the
    byte-table row zero{stage} (zero3_bf16 with bf16 master weights and optimizer states), its zero_optimization
    keys as the overrides the traffic model reads. Benchable where a benchable entry offloads the same way (no
    parameter offload: the bench's DeepSpeedStrategy reads ZeRO-3's partitions on the device)."""
    kinds = {(i.offload_optimizer, i.offload_param) for i in _ENTRIES if i.backend == "deepspeed" and i.benchable}
    return _zero(name, stage, offload_optimizer=offload_optimizer, offload_param=offload_param,
                 overrides=dict(zero or {}), planned=False, benchable=(offload_optimizer, offload_param) in kinds,
                 hierarchy="hpz" if hpz else "flat", low_precision_states=low_precision_states)  # fmt: skip


SP_SUFFIX = re.compile(r"^(?P<base>.+)_sp(?P<sp>[0-9]+)$")
"""A ZeRO strategy under Ulysses sequence parallelism: `zero3_sp2` is zero3 with groups of 2 ranks per row."""


def sequence_parallel_name(info: StrategyInfo, sp: int) -> str | None:
    """The name of `info` run with Ulysses groups of `sp` ranks (`zero3` -> `zero3_sp2`), or None where it has no
    such variant: only DeepSpeed's flat ZeRO entries do (Ulysses is DeepSpeed's; AutoTP, pipelines and hpZ's node
    groups would each need their own rank layout beside the SP groups)."""
    flat = info.backend == "deepspeed" and info.hierarchy == "flat" and info.model_parallel == 1
    return f"{info.name}_sp{sp}" if flat and info.sequence_parallel == 1 and info.benchable else None


def _sequence_parallel_variant(name: str, base: str, sp: int) -> StrategyInfo:
    info = check_name(base)
    if sp < 2 or sequence_parallel_name(info, sp) != name:
        able = [n for n, i in STRATEGIES.items() if sequence_parallel_name(i, 2)]
        raise UserError(f"unknown strategy {name!r}: {base} has no sequence-parallel variant of {sp} ranks"
                        if sp >= 2 else f"unknown strategy {name!r}: _spN takes N of 2 or more",
                        f"_spN (N >= 2) follows one of {', '.join(able)}, e.g. zero3_sp2")  # fmt: skip
    return replace(info, name=name, sequence_parallel=sp, planned=False)


def strategy_info(name: str) -> StrategyInfo | None:
    """The entry of a strategy name, a `_spN` variant's included; None for a name this version does not know (a
    record's, read back)."""
    try:
        return STRATEGIES.get(name) or (check_name(name) if SP_SUFFIX.match(name) else None)
    except UserError:
        return None


def check_name(name: str) -> StrategyInfo:
    """The registry entry of a strategy the benchmark can run (a `_spN` name: its base's, with N ranks per row);
    UserError (with the choices) otherwise."""
    benchable = [info.name for info in STRATEGIES.values() if info.benchable]
    variant = SP_SUFFIX.match(name)
    if variant and name not in STRATEGIES:
        return _sequence_parallel_variant(name, variant["base"], int(variant["sp"]))
    if is_user_config(name):
        raise UserError(f"{name!r} is not a strategy name: your own DeepSpeed config runs with --ds-config FILE",
                        "e.g. zero-kit bench --strategies ddp --ds-config my_config.json")  # fmt: skip
    if name not in STRATEGIES:
        raise UserError(f"unknown strategy {name!r}", f"choose from {', '.join(benchable)}")
    info = STRATEGIES[name]
    if not info.benchable:
        raise UserError(
            f"strategy {name!r} is planned by `zero-kit plan` but the benchmark cannot run it",
            f"choose from {', '.join(benchable)}",
        )
    return info


def check_model_parallel(
    info: StrategyInfo, world_size: int, layers: int, kv_heads: int, tied: bool, grad_accum: int = 1
) -> None:
    """Refuse, before any launch, a run the model-parallel backends cannot split (UserError, every problem at once):
    ranks not a multiple of the replica's, more stages than layers, KV heads AutoTP cannot divide, a tied head a
    pipeline would have to share between its first and last stage, a pipeline with data parallelism and only as many
    micro-batches as stages (each replica's rows make grad_accum x stages micro-batches; at grad_accum 1 torch
    2.13's DDP reducer fails on the second step: "rebuilt parameter indices size is not same as original")."""
    problems = []
    replicas = world_size // info.model_parallel if world_size % info.model_parallel == 0 else 0
    if info.pipeline_stages > 1 and replicas > 1 and grad_accum < 2:
        problems.append(UserError(f"{info.name} on {world_size} ranks ({replicas} data-parallel replicas) gets only "
                                  f"{info.pipeline_stages} micro-batches, one per stage: DDP inside the stages fails then",
                                  "--grad-accum 2 or more (with --micro-batch halved, the same global batch)"))  # fmt: skip
    if world_size % info.model_parallel:
        problems.append(UserError(f"{info.name} needs --nproc a multiple of {info.model_parallel}, got {world_size}",
                                  f"run {info.name} with --nproc {info.model_parallel} or a multiple"))  # fmt: skip
    if info.pipeline_stages > layers:
        problems.append(UserError(f"{info.name} cuts the model into {info.pipeline_stages} stages: it has {layers} layers",
                                  f"--layers {info.pipeline_stages} or more"))  # fmt: skip
    if info.pipeline_stages > 1 and tied:
        problems.append(UserError(f"{info.name} cannot split a model whose head is its embedding (tie_word_embeddings)",
                                  "use a model with an untied lm_head, or leave pp out"))  # fmt: skip
    if info.tensor_parallel > 1 and kv_heads % info.tensor_parallel:
        problems.append(UserError(f"{info.name}: AutoTP cannot split {kv_heads} KV heads {info.tensor_parallel} ways",
                                  f"a model whose KV heads are a multiple of {info.tensor_parallel}"))  # fmt: skip
    raise_all(problems, "before launching")


def build_strategy(
    name: str, model, options: StrategyOptions, info: StrategyInfo | None = None, ds_config: dict | None = None
) -> Strategy:
    """Wrap `model` (identically initialised on every rank) for strategy `name`; a user's own config passes its
    `info` (user_config_info) and `ds_config`, the DeepSpeed config to run as it is."""
    info = info or check_name(name)
    # Backends import torch / deepspeed: only the one asked for is imported, and only when a rank builds it.
    match info.backend:
        case "ddp":
            from zero_kit.strategies.ddp import DDPStrategy

            return DDPStrategy(model, options)
        case "fsdp":
            from zero_kit.strategies.fsdp import FSDPStrategy

            return FSDPStrategy(model, options, name=name, hierarchy=info.hierarchy)
        case "deepspeed":
            from zero_kit.strategies.deepspeed import DeepSpeedStrategy, ZeroSetup

            offload = "cpu" if info.offload_optimizer else "none"
            if ds_config is not None:  # the file's own keys: --zero-override and the run's hpZ size stay out
                setup = ZeroSetup(info.stage, offload, config=ds_config)
                return DeepSpeedStrategy(model, options, setup, name=name)
            zero = {**info.zero_overrides, **dict(options.zero_overrides)}
            secondary = info.secondary_ranks(options.world_size, options.ranks_per_node)
            if secondary:
                zero["zero_hpz_partition_size"] = secondary
            setup = ZeroSetup(info.stage, offload, zero, info.low_precision_states, info.tensor_parallel)
            return DeepSpeedStrategy(model, options, setup, name=name)
        case "pipeline":
            from zero_kit.strategies.pipeline import PipelineStrategy

            return PipelineStrategy(model, options, stages=info.pipeline_stages, name=name)
        case _:
            raise ValueError(f"unknown backend {info.backend!r} for strategy {name!r}")

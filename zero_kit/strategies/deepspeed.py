"""DeepSpeed ZeRO stages 0-3 (and optimizer offload) through `deepspeed.initialize`, with the config from
`zero_kit.config.builder.build_ds_config` (the same generator users get from `zero-kit config`).

Bytes are read from DeepSpeed's real buffers: module parameters (ZeRO-0/1/2) or ZeRO-3's `ds_tensor` partitions
(params); module `.grad`, `averaged_gradients` partitions and ZeRO-3's flat gradient-partition buffer (grads); the
fp32 master partitions (`single_partition_of_fp32_groups` at ZeRO-1/2, `fp32_partitioned_groups_flat` at ZeRO-3)
and the Adam state (optimizer). Views into one flat buffer count that buffer once, so what is reported is what
the rank holds. Working buffers are not model states and are left out, as `zero-kit plan` counts them apart:
reduce (ipg) buckets and ZeRO-3's persistent parameters (small ones kept gathered on every rank).

hpZ (`zero_hpz_partition_size`): each parameter also gets `ds_secondary_tensor`, its 16-bit partition over the
node's ranks, made whenever it is released (partition_parameters.py `_partition_param_sec`) and dropped after
every optimizer step (stage3.py `invalidate_secondary_tensor`). It is counted with the params, read when the
gradients are complete (just before the step), the only point of the step where it is sure to exist.

Low-precision states (`low_precision_states`): the "bf16" section gets `bf16_master_weights_and_grads` and
`bf16_optimizer_states` and a `torch_autocast` bf16 section is added, as DeepSpeed documents the pair; bf16 is
enabled whatever the run's precision, so an fp32 run of it does not do DDP's arithmetic (its loss difference is
in the bench's report).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from zero_kit.metrics import storage_bytes, storage_ptrs
from zero_kit.strategies.base import Strategy as _Base
from zero_kit.strategies.base import StrategyOptions, make_optimizer, optimizer_state_tensors
from zero_kit.strategies.ulysses import group_loss, register_ulysses, sequence_shard, with_gradient_scale

QUIET_STEPS = 1_000_000
"""steps_per_print of the bench's DeepSpeed runs: DeepSpeed's periodic log would interleave with the progress."""


@dataclass(frozen=True)
class ZeroSetup:
    """What a registry entry asks of DeepSpeed: the ZeRO stage, optimizer offload ("cpu" or "none"), the named
    variant's zero_optimization keys (hpZ size included) and bf16 low-precision optimizer states."""

    stage: int
    offload_optimizer: str
    zero: dict[str, Any] = field(default_factory=dict)
    low_precision_states: bool = False
    tensor_parallel: int = 1
    """AutoTP degree (`tensor_parallel.autotp_size`); ZeRO then partitions over world / tensor_parallel ranks."""
    config: dict[str, Any] | None = None
    """A user's own DeepSpeed config as the bench runs it (`user_ds_config`), used instead of the generator's."""


def ds_config_for(options: StrategyOptions, setup: ZeroSetup, hidden_size: int) -> dict[str, Any]:
    """The generator's config for this run (a user's own, `setup.config`, as it is: see `user_ds_config`). Changes,
    and why:
    - without offload the "optimizer" section is dropped and the same torch AdamW as DDP/FSDP2 is passed as a
      client optimizer: DeepSpeed's own AdamW choice (FusedAdam / CPU Adam) would make fp32 parity a test of
      optimizer kernels instead of ZeRO;
    - with tensor parallelism each rank feeds tp times the run's micro batch (a TP group of tp ranks trains on the
      rows tp data-parallel ranks would: the same global batch as every strategy), and a `tensor_parallel` section
      is added. DeepSpeed's batch check counts every rank, TP ranks included (runtime/config.py: world_size is the
      whole world when neither an mpu nor a mesh is passed), so its train_batch_size is tp x the rows trained;
    - steps_per_print is raised so DeepSpeed's periodic log does not interleave with the progress display;
    - wall_clock_breakdown is on for CPU ranks: DeepSpeed's own timers of each step, read by
      DeepSpeedStrategy.step_timers (the bench's cross-check of its phases; on 2 CPU ranks they cost nothing
      measurable, see docs/comparing.md). Not on GPUs: each timer synchronizes the device (start and stop, a dozen
      a step with the ZeRO optimizer's own), which would cost ZeRO, and not DDP, overlap in a throughput run."""
    from zero_kit.config.builder import RunAdjustments, build_ds_config
    from zero_kit.config.spec import ZeroSpec

    if setup.config is not None:
        return json.loads(json.dumps(setup.config))  # a copy: DeepSpeed may write into what it is given
    zero = dict(setup.zero)
    hpz = zero.pop("zero_hpz_partition_size", None)
    stage, offload_optimizer, low_precision_states = setup.stage, setup.offload_optimizer, setup.low_precision_states
    tp = setup.tensor_parallel
    spec = ZeroSpec(
        stage=stage,
        # the generator's bf16 state options are bf16 runs (--precision bf16): bf16 weights under bf16 autocast
        precision="bf16" if low_precision_states else options.precision,
        micro_batch=options.micro_batch * tp,
        grad_accum=options.grad_accum,
        world_size=options.world_size,
        hidden_size=hidden_size,
        offload_optimizer=offload_optimizer,
        lr=options.lr,
        weight_decay=options.weight_decay,
        gradient_clipping=options.gradient_clipping,
        hpz_partition_size=hpz,
        bf16_master_weights=low_precision_states,
        bf16_optimizer_states=low_precision_states,
        torch_autocast=low_precision_states,
        device="cpu" if options.device.startswith("cpu") else "cuda",
        sp=options.sequence_parallel,
    )
    run = RunAdjustments(client_optimizer=offload_optimizer == "none", steps_per_print=QUIET_STEPS, zero_overrides=zero)
    config = build_ds_config(spec, run)
    if tp > 1:
        config["tensor_parallel"] = {"autotp_size": tp}
    if options.device.startswith("cpu"):
        config["wall_clock_breakdown"] = True
    return config


def user_ds_config(config: dict[str, Any], options: StrategyOptions) -> tuple[dict[str, Any], list[str]]:
    """A user's own config (bench --ds-config) as the bench runs it, and each change in words. As written, except:
    - the batch keys are the bench's --micro-batch and --grad-accum (every strategy trains the same rows) and
      train_batch_size is dropped (DeepSpeed derives micro x accum x ranks, the same number);
    - steps_per_print is raised (QUIET_STEPS), and wall_clock_breakdown is on for CPU ranks only, as in
      `ds_config_for` (on GPUs each DeepSpeed timer synchronizes the device);
    - on CPU ranks an Adam/AdamW section goes through `on_cpu_ranks` (torch's fused AdamW: DeepSpeed's FusedAdam
      is a CUDA op build), unless the optimizer is offloaded to the CPU (DeepSpeed's CPU Adam steps it).
    Without an optimizer section DeepSpeedStrategy passes the bench's AdamW, as to every other ZeRO strategy."""
    from zero_kit.config.builder import on_cpu_ranks

    out, changes = json.loads(json.dumps(config)), []
    cpu = options.device.startswith("cpu")

    def put(key: str, value: Any, why: str, default: Any = None) -> None:
        if out.get(key, default) != value:
            changes.append(
                f"{key} {json.dumps(out[key]) if key in out else '(not given)'} -> {json.dumps(value)} ({why})"
            )
            out[key] = value

    put("train_micro_batch_size_per_gpu", options.micro_batch, "--micro-batch: every strategy trains the same rows")
    put("gradient_accumulation_steps", options.grad_accum, "--grad-accum")
    if "train_batch_size" in out:
        changes.append(f"train_batch_size {json.dumps(out.pop('train_batch_size'))} dropped (DeepSpeed derives"
                       " micro x accum x ranks)")  # fmt: skip
    if not isinstance(out.get("steps_per_print"), int) or out["steps_per_print"] < QUIET_STEPS:
        put("steps_per_print", QUIET_STEPS, "DeepSpeed's log would interleave with the progress")
    put("wall_clock_breakdown", cpu, "DeepSpeed's timers, read by the bench: CPU ranks only", default=False)
    adjusted = on_cpu_ranks(out) if cpu else out
    if adjusted != out:
        out = adjusted
        changes.append("optimizer through torch's fused AdamW (torch_adam: DeepSpeed's FusedAdam is a CUDA op)")
    return out, changes


class DeepSpeedStrategy(_Base):
    def __init__(self, model, options: StrategyOptions, setup: ZeroSetup, *, name: str) -> None:
        import deepspeed

        self.options = options
        self.name = name
        self.secondary_bytes = 0
        hidden = model.config.hidden_size
        self.config = ds_config_for(options, setup, hidden)
        self.tp = setup.tensor_parallel
        if self.tp > 1:
            _tp_model_init(model, self.tp, options.precision)
        client = None
        own = "optimizer" not in self.config  # the generator's config without offload, or a user's without one
        if own and self.tp > 1:
            # a factory, called with the parameters DeepSpeed trains: AutoTP's replacement layers'
            client = lambda params: make_optimizer(params, options)  # noqa: E731
        elif own:  # the optimizer object, as DDP and FSDP2 get it
            client = make_optimizer(model.parameters(), options)
        self.sp = options.sequence_parallel
        mpu = register_ulysses(model, options) if self.sp > 1 else None
        if mpu is not None:
            self.sp_rank, self.sp_group = mpu.get_sequence_parallel_rank(), mpu.get_sequence_parallel_group()
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=client, config=self.config, mpu=mpu
        )
        if options.compile:
            self.engine.compile()
        self.stage = setup.stage
        self._timers_ms: dict[str, float] = {}
        self.engine.timers.log = self._read_timers  # DeepSpeed logs (and resets) its timers; we read them instead

    def data_split(self) -> tuple[int, int, int]:
        # DeepSpeed's mesh is (data parallel, tensor parallel): a TP group is tp consecutive ranks on the same rows;
        # Ulysses' groups are sp consecutive ranks too (parallel_state_sp.initialize_sequence_parallel).
        import torch.distributed as dist

        group = self.tp * self.sp
        return dist.get_rank() // group, dist.get_world_size() // group, self.options.grad_accum

    def params_held(self) -> int:
        return sum(p.numel() for p in self.engine.module.parameters()) if self.tp > 1 else self.n_params

    def forward(self, batch: dict[str, Any], last: bool):
        batch = {k: v.to(self.engine.device) for k, v in batch.items()}
        if self.sp > 1:  # this rank's 1/sp of every row; the loss is the group's, over all of each row's tokens
            shard = sequence_shard(batch, self.sp_rank, self.sp)
            loss = group_loss(self.engine(**shard).loss, shard["shift_labels"], self.sp_group)
            return with_gradient_scale(loss, self.options.sp_gradient_scale)
        return self.engine(**batch).loss

    def backward(self, loss, last: bool) -> None:
        # DeepSpeed scales by 1/grad_accum itself and reduces only at its own accumulation boundary, which it
        # tracks by counting engine.step() calls: every micro step calls step(), the boundary one really steps
        # (in step()); a micro step's call updates nothing and counts in its backward.
        self.engine.backward(loss)
        if not last:
            self.engine.step()

    def step(self) -> None:
        assert self.engine.is_gradient_accumulation_boundary()
        self.engine.step()

    def grad_norm(self) -> float | None:
        norm = self.engine.get_global_grad_norm()  # None where DeepSpeed keeps none (ZeRO-0 with a client optimizer)
        return None if norm is None else float(norm)

    def _read_timers(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None) -> None:
        """In place of SynchronizedWallClockTimer.log (which prints on rank 0 and resets): the named timers' ms added to
        the step's, reset as DeepSpeed would, nothing printed. DeepSpeed logs its engine timers at each engine.step()
        (fwd, bwd, bwd_inner, bwd_allreduce, step: the optimizer step's sums at its boundary, and their per-micro-step
        twins) and the ZeRO optimizer's inside its step (ZeRO-1/2: optimizer_gradients, optimizer_step,
        optimizer_allgather; ZeRO-3: optimizer_step)."""
        timers = self.engine.timers.timers
        for name in names:
            if name in timers and not name.endswith("_microstep"):  # the micro-step twins repeat the sums
                self._timers_ms[name] = self._timers_ms.get(name, 0.0) + timers[name].elapsed(reset=reset) / normalizer
            elif name in timers and reset:
                timers[name].reset()

    def step_timers(self) -> dict[str, float]:
        taken, self._timers_ms = self._timers_ms, {}
        return taken

    def extra_record(self) -> dict[str, Any]:
        """ZeRO-3: the modules DeepSpeed gathers as one (its leaf modules, from the config's leaf_module), by class:
        what the engine applied, not what the config asked for."""
        if self.stage != 3:
            return {}
        from collections import Counter

        from deepspeed.utils import get_z3_leaf_modules

        return {"leaf_modules": dict(Counter(type(m).__name__ for m in get_z3_leaf_modules(self.engine.module)))}

    def _inner(self):
        return getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)

    def _param_tensors(self) -> list:
        params = list(self.engine.module.parameters())
        if self.stage == 3:  # the partition; a gathered (persistent or live) full copy is a working buffer
            return [p.ds_tensor for p in params]
        return params

    def _master_tensors(self) -> list:
        # ZeRO-3 empties the inner optimizer's param_groups outside step() (stage3.py `_optimizer_step` puts one
        # sub-group's fp32 partition in, steps, and sets it back to []), so the masters are read from DeepSpeed's
        # own lists; the param_groups still cover ZeRO-0 and the plain client optimizer.
        zero = self.engine.optimizer
        masters = [p for group in self._inner().param_groups for p in group["params"]]
        for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
            masters += [t for t in getattr(zero, name, None) or [] if t is not None]
        return masters

    def grad_bytes(self) -> int:
        secondary = [getattr(p, "ds_secondary_tensor", None) for p in self.engine.module.parameters()]
        self.secondary_bytes = storage_bytes(t for t in secondary if t is not None)
        zero = self.engine.optimizer
        tensors = [p.grad for p in self.engine.module.parameters()]
        for grads in getattr(zero, "averaged_gradients", {}).values():
            tensors += list(grads) if isinstance(grads, (list, tuple)) else [grads]
        tensors.append(getattr(zero, "grad_partitions_flat_buffer", None))
        tensors += [p.grad for group in self._inner().param_groups for p in group["params"]]
        return storage_bytes(t for t in tensors if t is not None)

    def param_and_optimizer_bytes(self) -> tuple[int, int]:
        param_tensors = self._param_tensors()
        owned = storage_ptrs(param_tensors)
        masters = self._master_tensors()
        state = optimizer_state_tensors(self._inner())
        # fp32 masters that *are* the module params (ZeRO-0 in fp32, or a ZeRO-3 partition DeepSpeed would step in
        # place) are counted once, as params.
        extra = [t for t in masters + state if t.numel() and t.untyped_storage().data_ptr() not in owned]
        return storage_bytes(param_tensors) + self.secondary_bytes, storage_bytes(extra)

    def notes(self) -> str:
        return (
            "DeepSpeed buffers: module params (ZeRO-3: ds_tensor partitions); grad partitions; fp32 master partitions "
            "+ Adam; buckets and ZeRO-3 persistent params left out (buffers)"
            + ("; params include hpZ's secondary partitions, read before the last step" if self.secondary_bytes else "")
            + (
                f"; AutoTP {self.tp}-way: params are this rank's slices plus the replicated layers"
                if self.tp > 1
                else ""
            )
        )


def _tp_model_init(model, tp: int, precision: str) -> None:
    """AutoTP's training entry. DeepSpeed 0.18 replaces the layers here (deepspeed.initialize only sets up the groups);
    0.19 records the arguments and replaces them inside deepspeed.initialize from the config's tensor_parallel."""
    import deepspeed
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    deepspeed.tp_model_init(model, tp_size=tp, dtype=dtype)

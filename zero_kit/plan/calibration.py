"""The step-time model calibrated from a measured `zero-kit bench` run (its results.jsonl): the compute rate from
the DDP (else ZeRO-0) record, and per strategy the overhead, what its measured step spends beyond the model.

Compute: the FLOP/s at which zero_kit.plan.timing reproduces the DDP step at the run's own layout, its
all-reduce (at the given rates) taken off; when the rates leave no time for compute, the whole step (the
rates then do not describe the machine the run was on).

Overhead per strategy: what its measured step spends beyond the model's step for that record (its layout, the
calibrated compute, the given rates): the framework's own work per step, DeepSpeed's and FSDP2's hooks,
flat-buffer and bucket copies, partitioned optimizer bookkeeping. The model lets the overhead run while the ranks
wait on a link (zero_kit.plan.timing), so where the record's step has waits W and runs d = measured - model
seconds longer, the overhead is d + W (only its part beyond the waits showed); then the model reproduces every
calibration record exactly. A negative d (faster than the model) is kept as it is. The overhead is a constant in
seconds, so it holds for the model, sequence and micro batch of the run: `zero-kit plan --calibrate` applies it
only to that model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from zero_kit.plan.memory import Hardware
from zero_kit.plan.parallel import record_layout
from zero_kit.plan.parallel_options import parallel_step_time
from zero_kit.plan.rates import Rates
from zero_kit.plan.timing import StepTime, compute_seconds, step_time
from zero_kit.plan.workload import Workload, from_record
from zero_kit.strategies import STRATEGIES

BASES = ("ddp", "zero0")


@dataclass(frozen=True)
class Calibration:
    flops_per_s: float
    source: str
    overhead_s: dict[str, float] = field(default_factory=dict)
    """Per strategy name (module doc); empty when the records lack the model's shape."""
    work: Workload | None = None
    """What the records trained (their model, sequence, micro batch), for whether the overheads apply."""


def layout_of(record: dict[str, Any]) -> Hardware:
    per_node = record.get("ranks_per_node") or record.get("world_size") or 1
    return Hardware(gpu_mem=0, gpus_per_node=per_node, nodes=max(1, (record.get("world_size") or 1) // per_node))


def calibrate(records: list[dict], origin: str, rates: Rates) -> Calibration | None:
    """Calibration from `records` (module doc); None without a usable DDP or ZeRO-0 record."""
    usable = [r for r in records if _usable(r)]
    base = next((r for name in BASES for r in usable if r["strategy"] == name), None)
    if base is None:
        return None
    per_rank = base["tokens_per_s"]["per_rank"]
    flops = base["flops_per_token"] * per_rank  # the whole step as compute: records without the model's shape
    where = f"{origin} ({base['strategy']}, {base.get('device', '?')}, {base.get('world_size', '?')} rank(s))"
    if not _has_shape(base):
        return Calibration(flops, f"calibrated from {where}: {flops / 1e12:.3g} TFLOP/s")
    work, layout = from_record(base), layout_of(base)
    info = STRATEGIES[base["strategy"]]
    comm = step_time(info, work, layout, replace(rates, flops_per_s=float("inf"), overhead_s={})).step_s
    compute = base["step_time_s"] - comm
    if compute > 0:
        flops = compute_seconds(work, replace(rates, flops_per_s=1.0)) / compute
    calibrated = replace(rates, flops_per_s=flops, overhead_s={})
    overheads = {r["strategy"]: _overhead(r, calibrated) for r in usable if _has_shape(r) and from_record(r) == work}
    source = f"calibrated from {where}, its comm at these rates taken off: {flops / 1e12:.3g} TFLOP/s"
    return Calibration(flops, source, overheads, work)


def record_step(record: dict[str, Any], rates: Rates) -> StepTime:
    """The model's step for a bench record at its own layout; a tensor- or pipeline-parallel strategy's through
    zero_kit.plan.parallel_options (its calibrated overhead, if `rates` has one, by the strategy's name)."""
    info = STRATEGIES[record["strategy"]]
    if info.model_parallel > 1:
        layout, work = record_layout(record)
        return parallel_step_time(layout, work, layout_of(record), rates, rates.overhead_s.get(info.name, 0.0))
    return step_time(info, from_record(record), layout_of(record), rates)


def _overhead(record: dict, rates: Rates) -> float:
    """The overhead that makes the model reproduce `record` (module doc)."""
    model = record_step(record, rates)
    beyond = record["step_time_s"] - model.step_s
    if beyond <= 1e-9 * record["step_time_s"]:  # faster than the model, or the base record (rounding)
        return min(beyond, 0.0)
    return beyond + sum(c.wait_s for c in model.comms)


MODEL_KEYS = ("n_params", "layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "seq_len")


def _has_shape(record: dict) -> bool:
    model, batch = record.get("model"), record.get("batch")
    return (
        isinstance(model, dict)
        and all(isinstance(model.get(k), int) for k in MODEL_KEYS)
        and isinstance(batch, dict)
        and isinstance(batch.get("micro"), int)
        and batch.get("grad_accum") == 1  # the traffic model counts one micro batch per step
        and record.get("precision") in ("bf16", "fp16", "fp32")
        and isinstance(record.get("step_time_s"), int | float)
        and record["step_time_s"] > 0
    )


def _usable(record: object) -> bool:
    if not isinstance(record, dict) or record.get("strategy") not in STRATEGIES or record.get("failed"):
        return False
    tokens = record.get("tokens_per_s")
    per_rank = tokens.get("per_rank") if isinstance(tokens, dict) else None
    fpt = record.get("flops_per_token")
    return all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in (per_rank, fpt))


def applies_to(calibration: Calibration, work: Workload) -> bool:
    """Whether the calibrated overheads hold for `work`: the same layers, hidden size, sequence, micro batch and
    precision as the calibration run (LoRA and checkpointing are not in a bench record, so they must be off)."""
    run = calibration.work
    if run is None or work.lora_r or work.activation_checkpointing:
        return False
    same_shape = (run.shape.hidden_size, run.shape.layers) == (work.shape.hidden_size, work.shape.layers)
    return same_shape and (run.seq_len, run.micro_batch, run.precision) == (work.seq_len, work.micro_batch,
                                                                             work.precision)  # fmt: skip


def apply(calibration: Calibration, rates: Rates, work: Workload) -> Rates:
    """`rates` with the calibrated compute rate, and the overheads where they apply to `work`."""
    source = calibration.source
    overheads = calibration.overhead_s if applies_to(calibration, work) else {}
    if overheads:
        source += f"; overhead per step of {len(overheads)} strategies from the same run"
    elif calibration.overhead_s:
        run = calibration.work
        source += (f"; its overheads not applied (measured at hidden {run.shape.hidden_size}, {run.shape.layers} "
                   f"layers, seq {run.seq_len}, micro batch {run.micro_batch}, {run.precision})")  # fmt: skip
    return replace(rates, flops_per_s=calibration.flops_per_s, compute_source=source, overhead_s=overheads)

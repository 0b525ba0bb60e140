"""The planner's stated constants: numbers it cannot measure on the machine that runs `zero-kit plan` (which
usually has no GPU), shown in its output and overridable with `--assume KEY=VALUE`. The defaults are the values
the memory model always used; the timing ones are explained beside each field and in `zero_kit.plan.timing`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zero_kit.metrics import GIB


@dataclass(frozen=True)
class Assumptions:
    cuda_context_nccl_gib: float = 1.0
    """GiB per GPU for the CUDA context, cuBLAS/NCCL workspaces and NCCL communicator buffers."""
    allocator_slack: float = 0.05
    """Fraction added to everything else on the GPU for the caching allocator's fragmentation (DDP, FSDP2, ZeRO-0:
    measured 0.04 on an H200, 1.2B LLaMA, benchmarks/gpu/results/gpu_h200_2026-11-26)."""
    zero_allocator_slack: float = 0.20
    """The same for DeepSpeed ZeRO-1/2/3, whose flat partitions, gradient buckets and per-step fp32 gradient copies
    fragment the caching allocator more: measured 0.23 (ZeRO-1/2) and 0.18 (ZeRO-3) on the same H200 run, without
    offload (the offload variants are assumed alike, not measured)."""
    host_baseline_gib: float = 2.0
    """GiB of host RAM per rank for Python, torch and the CUDA libraries."""
    overlap: float = 0.8
    """Fraction of the overlappable collectives' time hidden behind compute (never more than the compute time)."""
    pcie_gbs: float | None = None
    """GB/s per GPU between host and GPU for offload copies (default: the --gpu table's value)."""
    cpu_mem_gbs: float = 200.0
    """GB/s of host memory bandwidth per node that CPU Adam achieves (shared by the node's ranks)."""
    cpu_adam_bytes: float = 30.0
    """Bytes CPU Adam moves per parameter per step: reads fp32 param, grad, m, v (16), writes param, m, v (12)
    and the 16-bit copy (2)."""

    @property
    def cuda_context_bytes(self) -> int:
        return int(self.cuda_context_nccl_gib * GIB)

    @property
    def host_baseline_bytes(self) -> int:
        return int(self.host_baseline_gib * GIB)

    def changed(self) -> dict[str, float]:
        """The keys given a value other than the default (what the output marks as overridden)."""
        default = Assumptions()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


_FRACTIONS = ("allocator_slack", "zero_allocator_slack", "overlap")


def parse_assume(items: list[str]) -> tuple[Assumptions, list[str]]:
    """`["overlap=0.5", "cpu_mem_gbs=100"]` -> Assumptions, plus every problem found (empty when all are fine)."""
    keys = [f.name for f in dataclasses.fields(Assumptions)]
    values: dict[str, float] = {}
    problems: list[str] = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in keys:
            problems.append(f"--assume {item!r}: write KEY=VALUE with KEY one of {', '.join(keys)}")
            continue
        try:
            value = float(text)
        except ValueError:
            problems.append(f"--assume {key}={text!r} is not a number")
            continue
        low_ok = value >= 0 if key in _FRACTIONS or key.endswith("_gib") else value > 0
        if not low_ok or (key in _FRACTIONS and value > 1):
            bound = "in [0, 1]" if key in _FRACTIONS else (">= 0" if key.endswith("_gib") else "> 0")
            problems.append(f"--assume {key}={value:g} must be {bound}")
            continue
        values[key] = value
    return Assumptions(**values), problems


def describe(assume: Assumptions) -> str:
    """One line for the output: every constant, with the overridden ones marked."""
    changed = assume.changed()
    parts = []
    for f in dataclasses.fields(assume):
        value = getattr(assume, f.name)
        if value is None:
            continue
        parts.append(f"{f.name}={value:g}" + ("*" if f.name in changed else ""))
    return "assumed (--assume KEY=VALUE; * = overridden): " + ", ".join(parts)


def measured_on_gpu(records: list[object]) -> tuple[dict[str, float], str]:
    """The constants a GPU suite run measured (`python -m benchmarks.gpu.suite`'s suite.jsonl, its "planner" part), as
    --assume values, and where they come from. CUDA context + NCCL: the memory a fresh process holds after
    creating its context (above what other processes held) plus what its first NCCL communicator took; allocator
    slack: the largest reserved / allocated - 1 over the suite's planner runs. Raises ValueError saying why when
    the records hold no such measurement."""
    planner = next((r for r in records if isinstance(r, dict) and r.get("part") == "planner"), None)
    if planner is None:
        raise ValueError("no record of the suite's planner part")
    if planner.get("status") != "ok":
        raise ValueError(f"its planner part did not measure ({planner.get('status')}: {planner.get('reason')})")
    data = planner.get("data") or {}
    overhead = data.get("overhead") or {}
    values: dict[str, float] = {}
    context = overhead.get("context_bytes", overhead.get("used_after_context"))
    if _number(context):
        nccl = overhead.get("nccl_delta")
        values["cuda_context_nccl_gib"] = (context + (max(nccl, 0) if _number(nccl) else 0)) / GIB
    values.update(_measured_slack(data.get("comparisons", [])))
    if not values:
        raise ValueError("its planner part recorded neither the context/NCCL memory nor a reserved/allocated pair")
    gpu = (planner.get("hardware") or {}).get("gpu") or "a GPU"
    return values, f"measured on {gpu}"


ZERO_SLACK_STRATEGIES = ("zero1", "zero2", "zero3")
"""Runs whose reserved/allocated measures zero_allocator_slack (strategy names of the suite's records, with or
without an _offload suffix); every other run measures allocator_slack."""


def _measured_slack(comparisons: list) -> dict[str, float]:
    """allocator_slack and zero_allocator_slack: the largest reserved / allocated - 1 among the runs of each kind."""
    found: dict[str, list[float]] = {"allocator_slack": [], "zero_allocator_slack": []}
    for c in comparisons:
        if not (isinstance(c, dict) and _number(c.get("measured_reserved")) and _number(c.get("measured_allocated"))
                and c["measured_allocated"] > 0):  # fmt: skip
            continue
        zero = str(c.get("strategy", "")).split("_")[0] in ZERO_SLACK_STRATEGIES
        found["zero_allocator_slack" if zero else "allocator_slack"].append(
            c["measured_reserved"] / c["measured_allocated"] - 1
        )
    return {key: min(1.0, max(0.0, max(values))) for key, values in found.items() if values}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0

"""What every part of the GPU suite shares: the run context (output, dry mode, deadline), the record format and
its schema check, and running `zero-kit bench` strategies through zero_kit.bench.run_bench."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("ok", "failed", "skipped")
COMMON_KEYS = {"part": str, "status": str, "reason": (str, type(None)), "wall_s": float, "dry_run": bool,
               "data": dict, "versions": dict, "hardware": dict}  # fmt: skip
# Keys each part's `data` has when its status is "ok" (a failed or skipped part says why in `reason`).
PART_DATA_KEYS: dict[str, tuple[str, ...]] = {
    "environment": ("device", "torch", "cuda", "nccl", "bf16_supported", "deepspeed_ops", "matmul", "copy"),
    "train": ("runs",),
    "throughput": ("model", "micro_batch", "planned_fits", "runs", "targets"),
    "planner": ("comparisons", "overhead", "targets"),
    "sweep": ("setting", "runs", "not_run_budget"),
    "correctness": ("precision", "tolerance", "reference", "runs", "within_tolerance", "two_ranks_one_gpu"),
    "compile": ("runs",),
    "zeropp": ("strategies", "train_runs"),
    "long": ("strategy", "planned", "variants", "planned_only"),
}
TARGETS = {"zero2_vs_ddp_tokens_per_s": 0.90, "zero3_vs_ddp_tokens_per_s": 0.80, "ddp_mfu_bf16": 0.40,
           "planner_peak_rel_error": 0.10}  # fmt: skip
"""What the suite reports against (never asserts), the GPU issue's: at world size 1 on the 1B model at a micro batch
of 4 or more, ZeRO-2 at >= 90% and ZeRO-3 at >= 80% of plain PyTorch's tokens/s, MFU >= 40% of the datasheet peak
for plain PyTorch bf16 (llm-foundry's 1B: 41.8%), planner peak per GPU within +-10% of the measured one."""


@dataclass
class Context:
    out: Path
    dry_run: bool
    cuda: bool
    deadline: float
    versions: dict[str, Any]
    hardware: dict[str, Any]
    results: dict[str, dict] = field(default_factory=dict)
    next_port: int = 29880  # 29880-29949: no other launcher test's ports (tests/dist run two at a time)
    throughput: list[str] | None = None  # the throughput part's strategies (None: parts_bench.THROUGHPUT)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def port(self, count: int = 10) -> int:
        self.next_port += count
        return self.next_port - count


def make_record(ctx: Context, part: str, status: str, reason: str | None, wall_s: float, data: dict) -> dict:
    return {"part": part, "status": status, "reason": reason, "wall_s": round(float(wall_s), 3),
            "dry_run": ctx.dry_run, "data": data, "versions": ctx.versions, "hardware": ctx.hardware}  # fmt: skip


def check_record(record: dict) -> list[str]:
    """Schema problems of one suite.jsonl line (empty when valid)."""
    problems = [f"{key}: missing or not {kind}" for key, kind in COMMON_KEYS.items()
                if not isinstance(record.get(key), kind)]  # fmt: skip
    if problems:
        return problems
    part, status = record["part"], record["status"]
    if part not in PART_DATA_KEYS:
        problems.append(f"part {part!r} unknown; parts: {sorted(PART_DATA_KEYS)}")
    if status not in STATUSES:
        problems.append(f"status {status!r} not in {STATUSES}")
    if status != "ok" and not record["reason"]:
        problems.append(f"{part}: status {status} without a reason")
    if status == "ok" and part in PART_DATA_KEYS:
        problems += [f"{part}: data.{k} missing" for k in PART_DATA_KEYS[part] if k not in record["data"]]
    return problems


def append_jsonl(path: Path, record: dict) -> None:
    """One line, flushed and fsynced at once: a run cut off later keeps this part."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def run_strategies(ctx: Context, label: str, strategies: list[str], **options) -> list[dict]:
    """zero_kit.bench.run_bench for these strategies into OUT/bench/<label>; each run's timeout is capped by the
    suite's deadline. Returns the bench records (failed ones carry `failed` and the log tail)."""
    from zero_kit.bench import BenchOptions, run_bench

    out = ctx.out / "bench" / label
    timeout = int(max(30, min(options.pop("timeout", 600), ctx.remaining())))
    opts = BenchOptions(strategies=",".join(strategies), out=str(out), master_port=ctx.port(len(strategies) + 1),
                        timeout=timeout, **options)  # fmt: skip
    records = run_bench(opts, progress=lambda line: print(f"  [{label}] {line}", flush=True))
    for record in records:
        record["optimizer"] = optimizer_from_log(out / "logs" / f"{record['strategy']}.log")
    return records


_OPTIMIZER_LINES = (re.compile(r"DeepSpeed Basic Optimizer = (\w+)"), re.compile(r"Using (client) Optimizer"))


def optimizer_from_log(log: Path) -> dict[str, Any]:
    """Which optimizer DeepSpeed ran, read from the run's log (the bench record does not carry it). DeepSpeed
    logs it at INFO, which benchmarks/gpu/ds_info_log (put on PYTHONPATH by the suite) switches on."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    found = {"basic_optimizer": None, "client_optimizer": False, "source": str(log)}
    for line in text.splitlines():
        if match := _OPTIMIZER_LINES[0].search(line):
            found["basic_optimizer"] = match.group(1)
        if _OPTIMIZER_LINES[1].search(line):
            found["client_optimizer"] = True
    return found


def summarize_run(record: dict) -> dict[str, Any]:
    """The fields of one bench record that the suite's tables use."""
    if record.get("failed"):
        return {"strategy": record["strategy"], "failed": True, "log_tail": record.get("log_tail", [])[-5:]}
    peak = record.get("peak_mem_bytes", {})
    return {
        "strategy": record["strategy"],
        "world_size": record["world_size"],
        "precision": record["precision"],
        "losses": record["losses"],
        "tokens_per_s": record["tokens_per_s"]["total"],
        "tokens_per_s_per_rank": record["tokens_per_s"]["per_rank"],
        "step_time_s": record["step_time_s"],
        "mfu_datasheet": record.get("mfu"),
        "flops_per_token": record["flops_per_token"],
        "cuda_allocated": peak.get("cuda_allocated"),
        "cuda_reserved": peak.get("cuda_reserved"),
        "rss": peak.get("rss"),
        "compiled_graphs": record.get("compiled_graphs"),
        "compile_threads": record.get("compile_threads"),
        "optimizer": record.get("optimizer"),
        "model": record["model"],
        "batch": record["batch"],
    }

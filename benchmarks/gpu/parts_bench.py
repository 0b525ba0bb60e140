"""Suite parts b (bf16 correctness), d (throughput, ~1B LLaMA), e (planner truth), f (compile; ZeRO++ is part g,
parts_zeropp.py), all through zero_kit.bench.run_bench (one real launch per strategy) and `zero-kit plan --json`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu.common import TARGETS, Context, run_strategies, summarize_run

# Shaped like Llama-3.2-1B (random init: nothing is downloaded).
LLAMA_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True, "hidden_act": "silu",
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "torch_dtype": "bfloat16"}  # fmt: skip
TINY = {**LLAMA_1B, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 512}  # fmt: skip
BF16_LOSS_TOL = 0.02
"""bf16 correctness: every step's loss within 2% (relative) of DDP's; bf16 keeps 8 mantissa bits (~0.4% per
rounding) and the strategies round in different places (flat buffers, reduce order) over 20 steps."""
FP32_LOSS_TOL = 1e-4
THROUGHPUT = ["ddp", "zero1", "zero2", "zero3"]
"""The GPU issue's comparison; zero0 and the offload variants through --throughput when time allows."""
ZEROPP_STRATEGIES: list[str] = []
"""The place for ZeRO++ (qwZ quantized weights, qgZ quantized gradients; hpZ): add their registry names here once
zero_kit.strategies has them; the zeropp part (parts_zeropp.py) then benchmarks them against zero3."""


def model_dir(ctx: Context) -> Path:
    """config.json of the throughput model (tiny in dry mode) in a folder: `--model DIR` for the bench."""
    folder = ctx.out / "model_1b" if not ctx.dry_run else ctx.out / "model_tiny"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY if ctx.dry_run else LLAMA_1B, indent=1), encoding="utf-8")
    return folder


def _max_rel_diff(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=True))


def correctness(ctx: Context) -> tuple[str, str | None, dict]:
    """Part b: the embedded model through every strategy; losses against DDP's within a stated tolerance. The dry
    run compares the throughput part's two runs (ddp and zero3, fp32, one rank), which it would only repeat."""
    if ctx.dry_run:
        strategies, precision, tol, extra = ["ddp", "zero3"], "fp32", FP32_LOSS_TOL, {"steps": 3, "warmup": 1}
    else:
        strategies = ["ddp", "fsdp", "zero1", "zero2", "zero3", "zero3_offload"]
        precision, tol, extra = "bf16", BF16_LOSS_TOL, {"steps": 20, "warmup": 3}
    # dry: the throughput part's fp32 ddp and zero3 runs are this part's calls on another shape
    reused = ctx.dry_run and ctx.results.get("throughput_records")
    records = reused or run_strategies(ctx, "correctness", strategies, nproc=1, precision=precision, **extra)
    runs = [summarize_run(r) for r in records]
    reference = next((r for r in runs if r["strategy"] == "ddp" and not r.get("failed")), None)
    within = {}
    for run in runs:
        if reference and not run.get("failed"):
            run["max_rel_loss_diff_vs_ddp"] = _max_rel_diff(run["losses"], reference["losses"])
            within[run["strategy"]] = run["max_rel_loss_diff_vs_ddp"] <= tol
    data = {"precision": precision, "tolerance": {"max_rel_loss_diff_vs_ddp": tol}, "reference": "ddp",
            "runs": runs, "within_tolerance": within, "two_ranks_one_gpu": two_ranks_one_gpu(ctx, precision)}  # fmt: skip
    failed = [r["strategy"] for r in runs if r.get("failed")]
    off = [name for name, ok in within.items() if not ok]
    if failed or off or not reference:
        return "failed", f"failed runs: {failed}; outside tolerance: {off}", data
    return "ok", None, data


def two_ranks_one_gpu(ctx: Context, precision: str) -> dict[str, Any]:
    """Two ranks sharing the one GPU over NCCL: recent NCCL refuses ("Duplicate GPU detected"); recorded as is."""
    if not ctx.cuda:
        return {"status": "skipped", "reason": "skipped: no CUDA (two CPU ranks over gloo are tests/dist's job)"}
    records = run_strategies(ctx, "two_ranks_one_gpu", ["ddp", "zero3"], nproc=2, precision=precision, steps=10,
                             warmup=2, timeout=240)  # fmt: skip
    return {"status": "ran", "runs": [summarize_run(r) for r in records]}


MICRO_BATCHES = (8, 4)
"""The throughput part's micro batch: the largest of these at which `zero-kit plan` fits every strategy of the part
on this GPU (an H200's 139 GiB: 8; an H100's 80: 4, where ZeRO-1's planned 90 GiB at 8 does not fit). Micro batch 1
left the GPU idle (2,048 tokens a step: 13% MFU)."""


def throughput_micro_batch(ctx: Context, folder: Path, strategies: list[str], seq_len: int) -> tuple[int, dict]:
    """(the micro batch, what the planner said of each tried: label -> fits)."""
    gpu_mem = ctx.results.get("environment", {}).get("gpu_memory_bytes") or 80 * 10**9
    labels = {_plan_label(s) for s in strategies}
    planned: dict[int, dict[str, bool]] = {}
    for micro in MICRO_BATCHES:
        options = {o["label"]: o for o in plan_json(folder, gpu_mem, seq_len, micro, False)["options"]}
        planned[micro] = {label: bool(options[label]["fits"]) for label in sorted(labels) if label in options}
        if all(planned[micro].values()):
            return micro, planned
    return MICRO_BATCHES[-1], planned


def throughput(ctx: Context) -> tuple[str, str | None, dict]:
    """~1B LLaMA at seq 2048 bf16 at a micro batch that fills the GPU (throughput_micro_batch): plain PyTorch against
    ZeRO-1..3 (THROUGHPUT, or --throughput). Dry (CPU): the tiny shape, fp32, ddp and zero3, the same calls."""
    if not ctx.cuda and not ctx.dry_run:
        return "skipped", "skipped: no CUDA", {}
    folder = model_dir(ctx)
    if ctx.dry_run:
        strategies, precision, seq_len, extra = ["ddp", "zero3"], "fp32", 128, {"steps": 3, "warmup": 1}
    else:
        strategies, precision, seq_len = ctx.throughput or THROUGHPUT, "bf16", 2048
        extra = {"steps": 12, "warmup": 4, "timeout": 420}
    micro, planned = throughput_micro_batch(ctx, folder, strategies, seq_len)
    ctx.results["throughput_setting"] = {"model": str(folder), "seq_len": seq_len, "micro_batch": micro,
                                         "precision": precision}  # fmt: skip
    records = run_strategies(ctx, "throughput", strategies, nproc=1, precision=precision, model=str(folder),
                             seq_len=seq_len, micro_batch=micro, **extra)  # fmt: skip
    runs = [with_measured_mfu(ctx, summarize_run(r)) for r in records]
    ctx.results["throughput_records"] = records
    data = {"model": TINY if ctx.dry_run else LLAMA_1B, "micro_batch": micro, "planned_fits": planned, "runs": runs,
            "targets": throughput_targets(runs)}  # fmt: skip
    failed = [r["strategy"] for r in runs if r.get("failed")]
    return ("failed", f"failed runs: {failed}", data) if failed else ("ok", None, data)


def with_measured_mfu(ctx: Context, run: dict) -> dict:
    env = ctx.results.get("environment", {})
    peak = env.get("matmul", {}).get("tflops")
    if peak and not run.get("failed"):
        run["mfu_measured_peak"] = run["tokens_per_s_per_rank"] * run["flops_per_token"] / (peak * 1e12)
    return run


def throughput_targets(runs: list[dict]) -> dict[str, Any]:
    """ZeRO-2 and ZeRO-3 tokens/s against DDP's, and DDP's MFU, each against its target (reported, not asserted)."""
    by = {r["strategy"]: r for r in runs if not r.get("failed")}
    found = {}
    for stage in ("zero2", "zero3"):
        ratio = by[stage]["tokens_per_s"] / by["ddp"]["tokens_per_s"] if {"ddp", stage} <= by.keys() else None
        target = TARGETS[f"{stage}_vs_ddp_tokens_per_s"]
        found[f"{stage}_vs_ddp_tokens_per_s"] = {"value": ratio, "target": target,
                                                  "met": None if ratio is None else ratio >= target}  # fmt: skip
    mfu = by.get("ddp", {}).get("mfu_datasheet")
    found["ddp_mfu_bf16_datasheet"] = {"value": mfu, "target": TARGETS["ddp_mfu_bf16"],
                                       "met": None if mfu is None else mfu >= TARGETS["ddp_mfu_bf16"]}  # fmt: skip
    found["ddp_mfu_bf16_measured_peak"] = by.get("ddp", {}).get("mfu_measured_peak")
    return found


def plan_json(folder: Path, gpu_mem_bytes: int, seq_len: int, micro_batch: int, checkpointing: bool) -> dict:
    """`zero-kit plan --json` for one setting (the public CLI, as a user would call it)."""
    argv = [sys.executable, "-m", "zero_kit.cli", "plan", "--model", str(folder), "--gpu-mem",
            f"{gpu_mem_bytes / 2**30:.3f}GiB", "--seq-len", str(seq_len), "--micro-batch", str(micro_batch),
            "--precision", "bf16", "--json"] + (["--activation-checkpointing"] if checkpointing else [])  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode not in (0, 2):  # 2: nothing fits; the JSON still has every option
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr[-1000:]}")
    return json.loads(done.stdout)


def _plan_label(strategy: str) -> str:
    from zero_kit.strategies import STRATEGIES

    info = STRATEGIES[strategy]
    offload = "+opt+param-offload" if info.offload_param else "+opt-offload" if info.offload_optimizer else ""
    return info.accounting + offload


def compare_to_plan(folder: Path, record: dict, gpu_mem: int, context_bytes: int | None) -> dict[str, Any]:
    run = summarize_run(record)
    if run.get("failed"):
        return {"strategy": run["strategy"], "failed": True}
    plan = plan_json(folder, gpu_mem, run["model"]["seq_len"], run["batch"]["micro"], False)
    option = next(o for o in plan["options"] if o["label"] == _plan_label(run["strategy"]))
    predicted = option["gpu_bytes"]["total"]
    context_term = option["terms"]["buffers"].get("CUDA context + NCCL", {}).get("bytes", 0)
    measured = (run["cuda_reserved"] or 0) + (context_bytes if context_bytes is not None else context_term)
    return {"strategy": run["strategy"], "seq_len": run["model"]["seq_len"], "micro_batch": run["batch"]["micro"],
            "predicted_total": predicted, "predicted_without_context": predicted - context_term,
            "measured_allocated": run["cuda_allocated"], "measured_reserved": run["cuda_reserved"],
            "measured_reserved_plus_context": measured, "rel_error": predicted / measured - 1 if measured else None,
            "plan_terms": option["terms"]}  # fmt: skip


def planner(ctx: Context) -> tuple[str, str | None, dict]:
    """Part e: planner peak per GPU against measured CUDA peaks, plus the context/NCCL/allocator constants."""
    from benchmarks.gpu.parts_env import overhead_constants

    if not ctx.cuda:
        folder = model_dir(ctx)
        predicted = plan_json(folder, 80 * 10**9, 128, 2, False)["options"][0]["gpu_bytes"]
        data = {"comparisons": [], "predicted_only": predicted, "overhead": overhead_constants(ctx, None),
                "targets": {"planner_peak_rel_error": TARGETS["planner_peak_rel_error"]}}  # fmt: skip
        return "skipped", "skipped: no CUDA (planner predictions computed, nothing on a GPU to compare with)", data
    env = ctx.results.get("environment", {})
    baseline = (env.get("nvidia_smi") or {}).get("memory_used_mib")
    overhead = overhead_constants(ctx, baseline)
    folder, gpu_mem = model_dir(ctx), env.get("gpu_memory_bytes") or 80 * 10**9
    records = list(ctx.results.get("throughput_records", []))
    for label, strategies, extra in (("mb2", ["ddp", "zero3"], {"micro_batch": 2}),
                                     ("seq4096", ["zero3"], {"seq_len": 4096})):  # fmt: skip
        if ctx.remaining() > 120:
            records += run_strategies(ctx, f"planner_{label}", strategies, nproc=1, precision="bf16",
                                      model=str(folder), steps=8, warmup=3, timeout=300,
                                      **{"seq_len": 2048, "micro_batch": 1, **extra})  # fmt: skip
    context = overhead.get("context_bytes")
    comparisons = [compare_to_plan(folder, r, gpu_mem, context) for r in records]
    errors = [abs(c["rel_error"]) for c in comparisons if c.get("rel_error") is not None]
    target = TARGETS["planner_peak_rel_error"]
    data = {"comparisons": comparisons, "overhead": overhead,
            "activation_checkpointing": "not measured: zero_kit.bench.BenchOptions has no activation checkpointing",
            "targets": {"planner_peak_rel_error": {"max_abs_value": max(errors, default=None), "target": target,
                                                   "met": bool(errors) and max(errors) <= target}}}  # fmt: skip
    return "ok", None, data


def compile_part(ctx: Context) -> tuple[str, str | None, dict]:
    """Part f: torch.compile on CUDA for ddp and zero3 (1B model, seq 2048, bf16)."""
    if not ctx.cuda:
        return "skipped", "skipped: no CUDA", {}
    records = run_strategies(ctx, "compile", ["ddp", "zero3"], nproc=1, precision="bf16", model=str(model_dir(ctx)),
                             seq_len=2048, micro_batch=1, steps=10, warmup=4, compile=True, timeout=420)  # fmt: skip
    return "ok", None, {"runs": [summarize_run(r) for r in records]}

"""Suite part h: the longest sequence `zero-kit train` trains on one GPU with the ~1B LLaMA (issue 48), without and
with the long-sequence flags, against the planner's longest (`zero-kit plan --longest --json`, the same terms the
memory check of `zero-kit train` reads).

For each variant the planner's longest L for ZeRO-3 on this GPU is trained (2 steps, rows of about L tokens, micro
batch 1, bf16, `--no-memory-check`: the check would refuse the longer try), then 1.15 L if L trained, else 0.85 L:
the planner is within 15% of the truth when L trains and 1.15 L does not, or L does not and 0.85 L does. Without
CUDA (the dry run) each variant's plan is read and one variant trains at a short length, through the same code.

Activation checkpointing with tiled compute plans about 480k tokens on 141 GB: a step there takes minutes, so that
variant is planned only (`planned_only`). The offload of activation checkpoints to the host is not wired into
`zero-kit train` yet (docs/long_sequences.md), so it has no variant.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu.common import Context
from benchmarks.gpu.parts_bench import LLAMA_1B, TINY

VARIANTS = {"plain": [], "checkpointing": ["--activation-checkpointing"], "tiled": ["--tiled-compute"]}
PLANNED_ONLY = {"checkpointing+tiled": ["--activation-checkpointing", "--tiled-compute"]}
STRATEGY = "zero3"
"""`zero-kit train --stage 3 --nproc 1`'s row in the plan."""
DRY_LENGTH = 256
DRY_VARIANT = "tiled"
"""The dry run trains this variant only (the others differ by a flag train's own tests run)."""
MARGIN = 0.15

_WEIGHTS = r"""
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from zero_kit.model import load_tokenizer
config, out = json.load(open(sys.argv[1])), sys.argv[2]
tokenizer = load_tokenizer(None)
config = LlamaConfig(**{**config, "vocab_size": max(config["vocab_size"], len(tokenizer)),
                        "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
                        "eos_token_id": tokenizer.eos_token_id})
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = LlamaForCausalLM(config).to(torch.bfloat16 if torch.cuda.is_available() else torch.float32)
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


def weights_dir(ctx: Context) -> Path:
    """The ~1B LLaMA (tiny in the dry run) with random weights and the embedded tokenizer: `zero-kit train --model`."""
    folder = ctx.out / ("long_model_tiny" if ctx.dry_run else "long_model_1b")
    if not (folder / "config.json").is_file():
        shape = folder.with_suffix(".json")
        folder.parent.mkdir(parents=True, exist_ok=True)
        shape.write_text(json.dumps(TINY if ctx.dry_run else LLAMA_1B), encoding="utf-8")
        subprocess.run([sys.executable, "-c", _WEIGHTS, str(shape), str(folder)], check=True, timeout=600)
    return folder


def planned_longest(model: Path, gpu_bytes: int, flags: list[str]) -> dict:
    """The planner's longest sequence for STRATEGY on one GPU of `gpu_bytes`, and the terms that set it."""
    argv = [sys.executable, "-m", "zero_kit.cli", "plan", "--model", str(model), "--gpu-mem", f"{gpu_bytes // 1024}KiB",
            "--gpus-per-node", "1", "--micro-batch", "1", "--precision", "bf16", "--longest", "--json", *flags]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return next(row for row in json.loads(done.stdout)["longest"] if row["label"] == STRATEGY)


def rows_file(ctx: Context, length: int) -> Path:
    from benchmarks.long_sequences.memory import data_file

    work = ctx.out / "long_data"
    work.mkdir(parents=True, exist_ok=True)
    return data_file(work, length)


def train_at(ctx: Context, model: Path, name: str, length: int, flags: list[str]) -> dict:
    """Two steps of `zero-kit train` at `length` tokens: did it train, and how long it took."""
    output = ctx.out / "long" / name
    argv = [sys.executable, "-m", "zero_kit.cli", "train", "--model", str(model), "--data", str(rows_file(ctx, length)),
            "--format", "text", "--max-length", str(length), "--micro-batch", "1", "--stage", "3", "--max-steps", "2",
            "--precision", "bf16" if ctx.cuda else "fp32", "--no-export", "--no-memory-check", "--resume", "never",
            "--log-steps", "1", "--output", str(output), *flags, *(["--nproc", "1"] if ctx.cuda else [])]  # fmt: skip
    log = ctx.out / "long" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=max(60, min(600, ctx.remaining())))
    text = log.read_text(encoding="utf-8", errors="replace")
    return {"length": length, "trained": done.returncode == 0, "exit_code": done.returncode,
            "out_of_memory": "out of memory" in text.lower(), "wall_s": round(time.monotonic() - start, 1),
            "log": str(log), "command": " ".join(argv)}  # fmt: skip


def verdict(runs: list[dict], planned: int) -> bool | None:
    """Whether the planner's length is within MARGIN of the longest that trained (None: the runs cannot tell)."""
    at = next((r for r in runs if r["length"] == planned), None)
    other = next((r for r in runs if r["length"] != planned), None)
    if at is None or other is None:
        return None
    return at["trained"] != other["trained"]  # L trains and 1.15 L not, or L not and 0.85 L does


def long_sequences(ctx: Context) -> tuple[str, str | None, dict]:
    gpu_bytes = int((ctx.results.get("environment") or {}).get("gpu_memory_bytes") or 80 * 10**9)
    model = weights_dir(ctx)
    plans = {name: planned_longest(model, gpu_bytes, flags) for name, flags in {**VARIANTS, **PLANNED_ONLY}.items()}
    variants = {}
    for name, flags in VARIANTS.items():
        if ctx.dry_run:  # the path, not the limit (the tiny model's longest is millions of tokens): one variant
            runs = [train_at(ctx, model, name, DRY_LENGTH, flags)] if name == DRY_VARIANT else []
            variants[name] = {"runs": runs, "within_15pct": None}
            continue
        planned = plans[name]["seq_len"]
        first = train_at(ctx, model, f"{name}_{planned}", planned, flags)
        other = int(planned * (1 + MARGIN if first["trained"] else 1 - MARGIN))
        runs = [first, train_at(ctx, model, f"{name}_{other}", other, flags)]
        variants[name] = {"runs": runs, "within_15pct": verdict(runs, planned)}
    data = {"model": "tiny" if ctx.dry_run else "llama-3.2-1b shape", "gpu_memory_bytes": gpu_bytes,
            "strategy": STRATEGY, "planned": plans, "variants": variants, "planned_only": sorted(PLANNED_ONLY)}  # fmt: skip
    if ctx.dry_run:
        broken = [name for name, v in variants.items() if not all(run["trained"] for run in v["runs"])]
        return ("failed", f"dry runs failed: {broken}", data) if broken else ("ok", None, data)
    return "ok", None, data

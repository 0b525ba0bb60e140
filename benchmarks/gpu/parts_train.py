"""Suite part c: `zero-kit train` end to end (ZeRO-3, bf16 on CUDA), export, reload with plain transformers
(from_pretrained + generate), and a LoRA run, all through the public `zero-kit` CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu.common import Context

_RELOAD = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, device = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16 if device == "cuda" else None).to(device)
tok = AutoTokenizer.from_pretrained(path)
ids = tok("ZeRO stage 3", return_tensors="pt").to(device)
out = model.generate(**ids, max_new_tokens=12, do_sample=False)
empty = [n for n, p in model.named_parameters() if p.numel() == 0]
print(json.dumps({"generated": tok.decode(out[0]), "new_tokens": int(out.shape[1] - ids["input_ids"].shape[1]),
                  "n_params": sum(p.numel() for p in model.parameters()), "empty_params": empty}))
"""


def train_run(ctx: Context, name: str, extra: list[str], max_steps: int | None = None, log_name: str = "") -> dict:
    """`zero-kit train` into OUT/train/NAME (`--resume never` unless `extra` says otherwise), its log beside it
    (OUT/train/LOG_NAME.log, default NAME.log)."""
    output = ctx.out / "train" / name
    steps = str(max_steps or (2 if ctx.dry_run else 10))
    precision = "bf16" if ctx.cuda else "fp32"
    resume = [] if "--resume" in extra else ["--resume", "never"]
    argv = [sys.executable, "-m", "zero_kit.cli", "train", "--output", str(output), "--max-steps", steps,
            "--precision", precision, *resume, "--log-steps", "1", *extra]  # fmt: skip
    if ctx.cuda:
        argv += ["--nproc", "1"]  # under the real deepspeed launcher, as users run it
    start = time.monotonic()
    log = ctx.out / "train" / f"{log_name or name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as f:
        done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=max(60, min(600, ctx.remaining())))
    result = {"command": " ".join(argv), "exit_code": done.returncode, "wall_s": time.monotonic() - start,
              "log": str(log), "losses": _losses(output / "train_log.jsonl")}  # fmt: skip
    if done.returncode != 0:
        result["log_tail"] = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
    return result


def _losses(path: Path) -> list[float]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row["loss"] for row in rows if "loss" in row]


def _reload(ctx: Context, final: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _RELOAD, str(final), "cuda" if ctx.cuda else "cpu"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        return {"ok": False, "error": done.stderr[-1500:]}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found["ok"] = found["new_tokens"] > 0 and not found["empty_params"]
    return found


def train(ctx: Context) -> tuple[str, str | None, dict]:
    """ZeRO-3 (export, reload and generate; then resumed for 5 more steps), ZeRO-2, ZeRO-3 with the optimizer on the
    CPU (DeepSpeed's CPU Adam) and LoRA under ZeRO-3. The offload run is on CUDA only: its CPU Adam is an op build
    on first use, minutes on a small CPU machine, which the dry run in CI cannot afford; ZeRO-2 is left out of the
    dry run (the same code path as ZeRO-3's run, one launch less in CI)."""
    runs: dict[str, dict] = {}
    runs["zero3"] = train_run(ctx, "zero3", ["--stage", "3"])
    final = ctx.out / "train" / "zero3" / "final"
    ok = runs["zero3"]["exit_code"] == 0
    runs["zero3"]["reload"] = _reload(ctx, final) if ok else {"ok": False, "error": "training failed"}
    steps = 2 if ctx.dry_run else 10
    resumed = train_run(ctx, "zero3", ["--stage", "3", "--resume", "auto"], steps + 5, log_name="zero3_resumed")
    resumed["resumed_from"] = _resumed_from(ctx.out / "train" / "zero3_resumed.log")
    runs["zero3_resumed"] = resumed
    if not ctx.dry_run:  # the same call as ZeRO-3's with another --stage: the dry run saves the launch
        runs["zero2"] = train_run(ctx, "zero2", ["--stage", "2", "--no-export"])
    if ctx.cuda:
        runs["zero3_offload"] = train_run(ctx, "zero3_offload", ["--stage", "3", "--offload-optimizer", "cpu",
                                                                 "--no-export"])  # fmt: skip
    runs["lora"] = train_run(ctx, "lora", ["--stage", "3", "--lora-r", "8", "--lora-alpha", "16"])
    lora_final = ctx.out / "train" / "lora" / "final"
    runs["lora"]["adapter_files"] = sorted(p.name for p in lora_final.glob("*")) if lora_final.exists() else []
    data = {"runs": runs, "device": "cuda" if ctx.cuda else "cpu"}
    problems = [f"{name} exited {run['exit_code']}" for name, run in runs.items() if run["exit_code"] != 0]
    if ok and not runs["zero3"]["reload"]["ok"]:
        problems.append(f"reload of the export failed: {runs['zero3']['reload']}")
    if runs["zero3_resumed"]["exit_code"] == 0 and not runs["zero3_resumed"]["resumed_from"]:
        problems.append("the resumed run did not say which checkpoint it resumed from")
    return ("failed", "; ".join(problems), data) if problems else ("ok", None, data)


def _resumed_from(log: Path) -> str | None:
    """The checkpoint a run says it resumed from (its start line), or None."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    found = [line.split("resuming from ", 1)[1].strip() for line in text.splitlines() if "resuming from " in line]
    return found[-1] if found else None

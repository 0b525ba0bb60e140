"""Tokens/s of `zero-kit train --sp 2` against plain data parallelism on the same 2 ranks at the same sequence length
(issue 48 asks for at least 0.8x where both fit): the model of memory.py (random init, 16k context), rows of about
--length tokens, ZeRO-2, fp32, micro batch 1, alternating which runs first, --rounds times.

    python -m benchmarks.long_sequences.speed --length 4096 --out benchmarks/long_sequences/speed.jsonl

A run's figure is the median tokens/s train_log.jsonl reports over its steps after the first two (start-up and the
first gathers). dp=2 trains two rows per step (one per rank); sp=2 one row per step, each rank half of it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.long_sequences.memory import SHAPE, append_record, data_file, study_arguments
from benchmarks.plan_rss.run import model_dir


def tokens_per_s(model: Path, data: Path, length: int, sp: int, steps: int, out: Path) -> float:
    cmd = [sys.executable, "-m", "zero_kit.cli", "train", "--model", str(model), "--data", str(data), "--format",
           "text", "--max-length", str(length), "--micro-batch", "1", "--stage", "2", "--max-steps", str(steps),
           "--nproc", "2", "--no-export", "--no-memory-check", "--resume", "never", "--overwrite-output",
           "--output", str(out), *(["--sp", str(sp)] if sp > 1 else [])]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"sp={sp} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    figures = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")][2:]
    return statistics.median(figures)


def main() -> None:
    args = study_arguments(__doc__, "round", length=4096, steps=8, rounds=3)
    model, data = model_dir(args.work, SHAPE), data_file(args.work, args.length)
    ratios = []
    print("| round | dp=2 tokens/s | sp=2 tokens/s | sp / dp |\n|---|---|---|---|")
    for round_ in range(args.rounds):
        order = (1, 2) if round_ % 2 == 0 else (2, 1)
        got = {sp: tokens_per_s(model, data, args.length, sp, args.steps, args.work / f"speed_sp{sp}") for sp in order}
        ratios.append(got[2] / got[1])
        print(f"| {round_ + 1} | {got[1]:.0f} | {got[2]:.0f} | {ratios[-1]:.2f} |", flush=True)
        append_record(args.out, {"round": round_ + 1, "length": args.length, "order": order,
                                 "dp2_tokens_per_s": got[1], "sp2_tokens_per_s": got[2], "ratio": ratios[-1],
                                 "stage": 2})  # fmt: skip
    print(f"\nsp=2 / dp=2 tokens/s, median of {args.rounds}: {statistics.median(ratios):.2f} (issue 48 asks >= 0.8)")


if __name__ == "__main__":
    main()

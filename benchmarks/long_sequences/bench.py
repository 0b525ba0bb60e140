"""`zero-kit bench --sp 2` at a long sequence (issue 48): DDP, ZeRO-2 and ZeRO-3 on two ranks, each ZeRO strategy
beside its Ulysses row (two ranks per row), on the LLaMA memory.py builds (a 16,384-token context). The bench's table
sets each `_sp2` row against its sp=1 twin (loss, tokens/s, peak RSS) and splits every step into phases, all-to-all
included: where the difference goes.

    python -m benchmarks.long_sequences.bench                    # 4,096 tokens; prints the bench's table
    python -m benchmarks.long_sequences.bench --length 8192 --keep benchmarks/long_sequences/bench_8192

The runs are fp32, micro batch 1, 8 steps (2 of warm-up), synthetic rows of --length tokens. --keep copies the
bench's results.jsonl and table.md there (its logs and plots stay in --work).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.long_sequences.memory import SHAPE
from benchmarks.plan_rss.run import model_dir


def bench_argv(model: Path, length: int, out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "zero_kit.cli", "bench", "--model", str(model), "--strategies", "ddp,zero2,zero3",
            "--sp", "2", "--nproc", "2", "--seq-len", str(length), "--micro-batch", "1", "--steps", str(steps),
            "--warmup", "2", "--timeout", "1800", "--out", str(out), "--force"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--work", type=Path, default=Path("/tmp/zk_long_sequences"))
    parser.add_argument("--keep", type=Path, default=None, help="copy results.jsonl and table.md here")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    out = args.work / f"bench_{args.length}"
    subprocess.run(bench_argv(model_dir(args.work, SHAPE), args.length, out, args.steps), check=True)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        for name in ("results.jsonl", "table.md"):
            shutil.copy(out / name, args.keep / name)


if __name__ == "__main__":
    main()

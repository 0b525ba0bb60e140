"""`zero-kit bench`: DDP, FSDP2 and ZeRO-0..3 with real launches (torchrun / deepspeed), same model, data, seed
and batch; writes results.jsonl, table.md and PNG plots to --out. Heavy imports happen inside `run`."""

from __future__ import annotations

import argparse
import sys

from zero_kit.options import add_dataclass_arguments, dataclass_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from zero_kit.bench import BenchOptions

    add_dataclass_arguments(parser, BenchOptions)


def _progress(line: str) -> None:
    # One status line rewritten in place on a terminal; plain lines in logs and CI.
    if sys.stderr.isatty():
        print(f"\r\033[K{line}", end="" if " step " in line else "\n", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from zero_kit.bench import BenchOptions, run_bench
    from zero_kit.errors import UserError

    opts = dataclass_from_args(BenchOptions, args)
    if opts.nproc < 1 or opts.steps <= opts.warmup:
        raise UserError(
            f"need --nproc >= 1 and --steps > --warmup, got --nproc {opts.nproc}, --steps {opts.steps},"
            f" --warmup {opts.warmup}",
            "e.g. --nproc 2 --steps 20 --warmup 3",
        )
    records = run_bench(opts, progress=_progress)
    with open(f"{opts.out}/table.md", encoding="utf-8") as table:
        print(table.read())
    failed = [r["strategy"] for r in records if r.get("failed")]
    if failed:
        print(f"zero-kit bench: failed: {', '.join(failed)} (logs in {opts.out}/logs)", file=sys.stderr)
    return 1 if failed else 0

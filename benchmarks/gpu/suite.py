"""GPU truth in one command. On the GPU machine, after `pip install --no-index --find-links .whl zero_kit`:

    python -m benchmarks.gpu.suite --out benchmarks/gpu/results/gpu_h100

Time-boxed (--budget-min, default 9 min: 15 minutes on the machine less its start). Parts, in order, each
appending its record (one JSON line) to OUT/suite.jsonl the moment it finishes, so a run cut off keeps what it
measured:

  environment  GPU, driver, CUDA, torch, NCCL, DeepSpeed op builds, bf16, bf16 8192^3 matmul peak, D2D copy
  train        `zero-kit train` bf16: ZeRO-3 + export + from_pretrained/generate, resumed for 5 more steps; ZeRO-2;
               ZeRO-3 with the optimizer offloaded (DeepSpeed's CPU Adam); LoRA under ZeRO-3
  throughput   ~1B LLaMA (Llama-3.2-1B shape), seq 2048, bf16, at the largest micro batch (8, 4) the planner fits:
               ddp vs zero1..3 (--throughput for others); tokens/s, MFU, memory
  planner      `zero-kit plan --json` peak vs measured (throughput's runs + micro batch 2, seq 4096); constants
  sweep        --zero-override settings of the performance issue against the generator's, at throughput's batch
  correctness  the embedded model, 20 bf16 steps: ddp, fsdp, zero1, zero2, zero3, zero3_offload (+ 2 ranks on 1 GPU)
  compile      torch.compile for ddp and zero3
  zeropp       `zero-kit train --ds-config` with ZeRO++ qwZ+qgZ and with the bf16 low-precision states vs plain
               ZeRO-3 (losses reported); without CUDA, checks that qwZ/qgZ are refused with the reason
  long         the longest sequence `zero-kit train` trains on one GPU with the ~1B model, plain, with activation
               checkpointing and with tiled compute, against the planner's longest (issue 48; parts_long.py)

then OUT/summary.md and PNG plots (`python -m benchmarks.gpu.summary OUT` re-renders them). Targets are
reported, never asserted (benchmarks/gpu/common.py TARGETS). Versions and hardware are in every record.

CPU dry mode (CI: tests/dist/test_gpu_suite_dry.py): `python -m benchmarks.gpu.suite --dry-run --out DIR` runs
what needs no CUDA with tiny shapes (fp32, 3 steps; throughput and sweep too), writes `skipped: no CUDA` records for
the rest, and checks every record's schema (exit 1 on a schema problem).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from benchmarks.gpu import parts_bench, parts_env, parts_long, parts_sweep, parts_train, parts_zeropp
from benchmarks.gpu.common import Context, append_jsonl, check_record, make_record

PARTS = [
    ("environment", parts_env.environment),
    ("train", parts_train.train),
    ("throughput", parts_bench.throughput),
    ("planner", parts_bench.planner),
    ("sweep", parts_sweep.sweep),
    ("correctness", parts_bench.correctness),
    ("compile", parts_bench.compile_part),
    ("zeropp", parts_zeropp.zeropp),
    ("long", parts_long.long_sequences),
]
"""In the GPU issue's order of value: train on CUDA, throughput at a micro batch that fills the GPU, the planner
out of sample, the sweep; then bf16 parity, compile and ZeRO++ while time remains; the long-sequence limits last
(6 runs of the 1B model: `--parts environment,long` when they are what the machine is for)."""
RESERVE_S = {"train": 60, "throughput": 120, "planner": 30, "sweep": 90, "correctness": 60, "compile": 90,
             "zeropp": 150, "long": 240}  # fmt: skip
"""A part starts only with at least this many seconds of the budget left (else: skipped, budget spent)."""


def _versions_and_hardware(cuda: bool) -> tuple[dict, dict]:
    import importlib.metadata as metadata

    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("deepspeed", "transformers", "accelerate", "peft", "datasets", "zero_kit"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    hardware = {"machine": platform.machine(), "cpus": os.cpu_count(), "node": platform.node()}
    if cuda:
        smi = parts_env.nvidia_smi()  # not torch.cuda: this process must hold no CUDA context
        hardware.update(gpu=smi.get("name"), driver=smi.get("driver"), gpu_count=torch.cuda.device_count())
    return versions, hardware


def run_part(ctx: Context, name: str, fn) -> dict:
    start = time.monotonic()
    if name in RESERVE_S and ctx.remaining() < RESERVE_S[name]:
        return make_record(ctx, name, "skipped", f"skipped: time budget spent ({ctx.remaining():.0f} s left)", 0, {})
    print(f"[gpu-suite] {name} ({ctx.remaining():.0f} s of budget left)", flush=True)
    try:
        status, reason, data = fn(ctx)
    except Exception as err:  # one broken part must not cost the others their records
        status, reason, data = "failed", f"{type(err).__name__}: {err}", {"traceback": traceback.format_exc()[-4000:]}
    if name == "environment" and status == "ok":
        ctx.results["environment"] = data
    return make_record(ctx, name, status, reason, time.monotonic() - start, data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GPU truth in one command (see the module docstring)")
    parser.add_argument("--out", required=True, help="output folder, e.g. benchmarks/gpu/results/gpu_h100")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes; CUDA parts write skipped records")
    parser.add_argument("--budget-min", type=float, default=9.0,
                        help="time box for the whole suite (9: 15 minutes on the machine less its start)")  # fmt: skip
    parser.add_argument("--parts", default=",".join(n for n, _ in PARTS),
                        help="comma-separated subset, run in the order given (planner after throughput: it reuses "
                             "throughput's runs); little time on the GPU puts the parts needed most first")  # fmt: skip
    parser.add_argument("--throughput", default=None,
                        help="comma-separated strategies of the throughput part (default: all of "
                             "parts_bench.THROUGHPUT), e.g. ddp,zero1,zero2,zero3,zero3_offload when time is short")  # fmt: skip
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # DeepSpeed's INFO log (which optimizer it built) in every rank's log: see ds_info_log/sitecustomize.py.
    hook = str(Path(__file__).resolve().with_name("ds_info_log"))
    root = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (hook, root, os.environ.get("PYTHONPATH")) if p)
    versions, hardware = _versions_and_hardware(cuda)
    ctx = Context(out, args.dry_run, cuda, time.monotonic() + args.budget_min * 60, versions, hardware)
    if args.throughput:
        ctx.throughput = args.throughput.split(",")
    jsonl = out / "suite.jsonl"
    jsonl.write_text("", encoding="utf-8")
    wanted = args.parts.split(",")
    known = dict(PARTS)
    if unknown := [name for name in wanted if name not in known]:
        parser.error(f"--parts: unknown part(s) {unknown}; parts: {','.join(known)}")
    problems = []
    for name in wanted:
        fn = known[name]
        record = run_part(ctx, name, fn)
        append_jsonl(jsonl, record)
        problems += [f"{name}: {p}" for p in check_record(json.loads(json.dumps(record, default=str)))]
        print(
            f"[gpu-suite] {name}: {record['status']} in {record['wall_s']:.0f} s {record['reason'] or ''}", flush=True
        )
    from benchmarks.gpu.summary import write_summary

    print(write_summary(out).read_text(encoding="utf-8"))
    for problem in problems:
        print(f"schema problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

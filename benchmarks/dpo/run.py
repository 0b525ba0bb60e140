"""`zero-kit train --method dpo` on two CPU ranks, fp32, the shipped preference set (148 pairs, 30 held out with
--val-size 0.2): the three figures issue 49 asks for, each in one run of this script.

- **held-out margin**: ZeRO-2, ZeRO-3, ZeRO-3 with CPU offload (optimizer and parameters), and ZeRO-2 with LoRA, one
  epoch on the embedded model, the held-out pairs' reward margin every 5 steps against step 0's (0: the trained
  model is the reference);
- **reference: model vs precompute**: ZeRO-3 on the same pairs and the 40M-parameter model below (on the embedded
  3M model a step is mostly fixed cost: the reference's forward is lost in the noise of 2 shared cores), 20 steps, the
  reference model run every step against the log-probabilities precomputed before training, one after the other in
  this run: median step time (steps 3 to 20) and the precompute's one-off seconds; then the precompute run again on
  the same data cache, which reads the cache back;
- **memory**: the planner's peak per rank (what `zero-kit train` checks: zero_kit.train.guards.fit.rank_peak)
  against each rank's measured peak RSS (the kernel's high-water mark, benchmarks/startup/measure.py),
  ZeRO-2 and ZeRO-3, on a 40M-parameter LLaMA (benchmarks/plan_rss's shape: the embedded model's 3M would measure
  only the fixed baseline), pairs of up to 64 tokens, micro batch 2.

    python -m benchmarks.dpo.run [--parts margin speed memory] [--out benchmarks/dpo/results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import psutil

from benchmarks.plan_rss.run import model_dir
from benchmarks.startup.measure import train

GIB = 2**30
COMMON = ["--method", "dpo", "--nproc", "2", "--max-length", "64", "--micro-batch", "2", "--log-steps", "1",
          "--resume", "never", "--no-memory-check"]  # fmt: skip
MARGIN_RUNS = {  # full fine-tuning at 2e-4 (the default 1e-3 overfits the 118 pairs within the epoch); LoRA 2e-3
    "zero2": ["--stage", "2", "--lr", "2e-4"],
    "zero3": ["--stage", "3", "--lr", "2e-4"],
    "zero3_offload": ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu", "--lr", "2e-4"],
    "zero2_lora": ["--stage", "2", "--lora-r", "8", "--lr", "2e-3"],
}
HELD_OUT = ["--val-size", "0.2", "--eval-steps", "5", "--lr-scheduler", "constant"]


def launch(argv: list[str], out: Path, cache: Path) -> dict:
    """One `zero-kit train` run, measured from outside by the startup study's `train` (each rank's peak resident
    memory, VmHWM): its terminal, wall seconds, train_log records and each rank's peak in bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    result = train([*COMMON, *argv, "--data-cache", str(cache)], out, log)
    if result["exit_code"] != 0:
        raise SystemExit(f"{result['command']} failed ({result['exit_code']}):\n{log.read_text()[-3000:]}")
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return {"stdout": log.read_text(), "wall_s": result["wall_s"], "records": records,
            "rank_peaks": [mib * 2**20 for mib in result["peak_rss_mib_per_rank"]]}  # fmt: skip


def margin_part(work: Path) -> list[dict]:
    rows = []
    for name, flags in MARGIN_RUNS.items():
        flags = [*flags, *HELD_OUT]
        done = launch([*flags, "--dpo-reference", "model"], work / f"margin_{name}", work / "cache")
        evals = [(r["step"], r["eval_reward_margin"]) for r in done["records"] if "eval_reward_margin" in r]
        best = max(evals, key=lambda pair: pair[1])
        rows.append({"part": "margin", "run": name, "flags": flags, "held_out_margins": evals, "best": best,
                     "rises": best[1] > 0.0, "wall_s": round(done["wall_s"], 1)})  # fmt: skip
        print(f"| {name} | {' '.join(f'{s}:{m:+.3f}' for s, m in evals)} | {best[1]:+.3f} at step {best[0]} |",
              flush=True)  # fmt: skip
    return rows


def step_times(records: list[dict]) -> list[float]:
    train = [r for r in records if "loss" in r and "elapsed_s" in r]
    return [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(train[2:], train[3:], strict=False)]


def speed_part(work: Path) -> list[dict]:
    rows, cache, model = [], work / "speed_cache", model_dir(work)
    for name, reference in (("model", "model"), ("precompute", "precompute"), ("precompute again", "precompute")):
        out = work / f"speed_{name.replace(' ', '_')}"
        flags = [
            "--model",
            str(model),
            "--stage",
            "3",
            "--max-steps",
            "20",
            "--no-export",
            "--dpo-reference",
            reference,
        ]
        done = launch(flags, out, cache)
        steps = step_times(done["records"])
        said = [line for line in done["stdout"].splitlines() if "DPO reference:" in line]
        rows.append({"part": "speed", "run": name, "median_step_s": statistics.median(steps), "steps": len(steps) + 3,
                     "reference_lines": said, "wall_s": round(done["wall_s"], 1)})  # fmt: skip
        print(f"| {name} | {statistics.median(steps):.3f} | {len(steps) + 3} | {said[-1].split('DPO reference: ')[1]} |",
              flush=True)  # fmt: skip
    return rows


def planned_rank_peak(model: Path, stage: int, precompute: bool) -> int:
    from zero_kit.train.guards.fit import rank_peak
    from zero_kit.train.options import TrainOptions
    from zero_kit.train.plan import Host, plan_run

    opts = TrainOptions(model=str(model), method="dpo", max_length=64, micro_batch=2, stage=stage, nproc=2)
    plan = plan_run(opts, {}, Host(on_gpu=False, bf16_supported=False))
    return rank_peak(replace(plan, dpo_precompute=precompute).planner(), on_gpu=False)


def memory_part(work: Path) -> list[dict]:
    model, rows = model_dir(work), []
    for stage in (2, 3):
        for reference in ("model", "precompute"):
            out = work / f"memory_zero{stage}_{reference}"
            done = launch(["--model", str(model), "--stage", str(stage), "--max-steps", "6", "--no-export",
                           "--dpo-reference", reference], out, work / "cache")  # fmt: skip
            plan = planned_rank_peak(model, stage, reference == "precompute")
            peak = max(done["rank_peaks"])
            rows.append({"part": "memory", "run": f"zero{stage} {reference}", "planned": plan,
                         "rank_peaks": done["rank_peaks"], "ratio": plan / peak})  # fmt: skip
            print(f"| zero{stage} | {reference} | {plan / GIB:.2f} | "
                  f"{' / '.join(f'{p / GIB:.2f}' for p in done['rank_peaks'])} | {plan / peak:.2f} |", flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["margin", "speed", "memory"])
    parser.add_argument("--work", type=Path, default=Path("/tmp/zk_dpo_bench"))
    parser.add_argument("--out", type=Path, default=None, help="append one JSON line per run")
    args = parser.parse_args()
    import deepspeed
    import torch
    import transformers
    import trl

    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "deepspeed": deepspeed.__version__, "trl": trl.__version__}  # fmt: skip
    print(f"command: python -m benchmarks.dpo.run --parts {' '.join(args.parts)}; {versions}; "
          f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / GIB:.1f} GiB")  # fmt: skip
    headers = {
        "margin": "| run | held-out reward margin by step (step 0: 0) | best |\n|---|---|---|",
        "speed": "| ZeRO-3 reference | median step s | steps | what the reference line said |\n|---|---|---|---|",
        "memory": "| stage | reference | planned GiB per rank | measured peak RSS GiB per rank | planned / measured |"
        "\n|---|---|---|---|---|",
    }
    parts = {"margin": margin_part, "speed": speed_part, "memory": memory_part}
    for name in args.parts:
        print(headers[name], flush=True)
        rows = parts[name](args.work)
        if args.out:
            with args.out.open("a") as out:
                for row in rows:
                    out.write(json.dumps({**row, **versions, "date": time.strftime("%Y-%m-%d")}) + "\n")


if __name__ == "__main__":
    main()

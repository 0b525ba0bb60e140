"""Start-up, measured (issue 23, part 4): the time to first step by stage for the default job and a ~0.4B LLaMA
shape, and an A/B of threads per rank that justifies zero_kit's rule (cores / local ranks).

    python -m benchmarks.startup.run stages                 # the default job and the ~0.4B shape, 2 CPU ranks
    python -m benchmarks.startup.run stages --jobs default --repeat 3
    python -m benchmarks.startup.run threads --pairs 3      # 2 ranks: 1 vs 2 threads each, alternating
    python -m benchmarks.startup.run commands --pairs 30    # quick commands against `python -c pass`, alternating

Each job is `zero-kit train --nproc 2 --stage 3 --max-steps 1 --no-export` (the ~0.4B one stops once the start-up
record is written: the save of its 6.6 GB of ZeRO-3 state that follows is not start-up). The ~0.4B model is a random
init saved once into --work (LlamaConfig below, the embedded tokenizer). Threads: a ~26M LLaMA shape trains
--steps steps per run with OMP_NUM_THREADS=1 and =2 in turn; the figure is the mean step time after the first.
Commands (issue 50): `zero-kit config`, `zero-kit --help` and `zero-kit config --help`, each run in turn with a bare
`python -c pass` of the same interpreter; the figure is the median of the per-pair ratios (a pair shares the
machine's mood), with both medians in seconds.
Results go to results/<date>_<what>.json beside this file; README.md has the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.startup.measure import environment, train

HERE = Path(__file__).resolve().parent
BASE = ["--nproc", "2", "--stage", "3", "--no-export", "--resume", "never"]
SHAPES = {
    # ~0.41B: 32 layers of 12.8M (attention 4 x 1024^2, MLP 3 x 1024 x 2816) and a 2048-token vocabulary
    "llama-0.4b": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=32, num_attention_heads=16,
                       num_key_value_heads=16),
    # ~26M: enough compute per step for threads to matter, a start-up short enough to repeat
    "llama-26m": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=8),
}  # fmt: skip


def model_dir(name: str, work: Path) -> Path:
    """A Hugging Face directory of `name`'s shape: random init (seed 0), fp32 safetensors, the embedded tokenizer."""
    target = work / name
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM

    from zero_kit.model import build_config, load_tokenizer

    tokenizer = load_tokenizer(None)
    config = build_config(None, **SHAPES[name])  # the embedded model's config (tokenizer ids) at this shape
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    partial = work / f"{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters in {target}", flush=True)
    return target


def stages(jobs: list[str], repeat: int, work: Path) -> dict:
    results: dict[str, list] = {}
    for job in jobs:
        args, big = list(BASE) + ["--max-steps", "1"], job != "default"
        if big:
            shape, _, tuning = job.partition("+")  # llama-0.4b+lora: LoRA r=8 where full fine-tuning's 16 B/param
            args += ["--model", str(model_dir(shape, work)), "--max-length", "128", "--micro-batch", "1"]
            args += ["--lora-r", "8"] if tuning == "lora" else []  # of ZeRO-3 state do not fit the host's free RAM
        for index in range(repeat):
            result = train(args, work / f"run_{job}", work / f"{job}_{index}.log", stop_at_first_step=big)
            results.setdefault(job, []).append(result)
            print(f"{job} #{index}: {json.dumps(result.get('startup'))} peak RSS {result['peak_rss_mib_per_rank']}")
    return results


def threads(pairs: int, steps: int, work: Path) -> dict:
    model = model_dir("llama-26m", work)
    args = [*BASE, "--model", str(model), "--max-steps", str(steps), "--log-steps", "1", "--max-length", "256"]
    runs: dict[str, list] = {"1": [], "2": []}
    for index in range(pairs):
        for omp in ("1", "2") if index % 2 == 0 else ("2", "1"):  # ABBA: drift of the machine cancels
            output = work / f"threads_{omp}"
            result = train(args, output, work / f"threads_{omp}_{index}.log", extra_env={"OMP_NUM_THREADS": omp})
            result["step_s"] = _step_time(output / "train_log.jsonl")
            runs[omp].append(result)
            print(f"OMP_NUM_THREADS={omp} #{index}: mean step {result['step_s']} s", flush=True)
    return {"model": "llama-26m", "steps": steps, "runs": runs}


def _step_time(log: Path) -> float | None:
    """Mean seconds per step after the first (train_log.jsonl's elapsed_s is counted from the train start)."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
    steps = [r for r in records if "elapsed_s" in r and "loss" in r]
    starts = [index for index, r in enumerate(steps) if r["step"] == 1]
    steps = steps[starts[-1] :] if starts else steps  # the log is appended to: this run's records only
    if len(steps) < 2:
        return None
    return round((steps[-1]["elapsed_s"] - steps[0]["elapsed_s"]) / (steps[-1]["step"] - steps[0]["step"]), 3)


QUICK = {
    "config": [
        "config",
        "--stage",
        "3",
        "--offload-optimizer",
        "cpu",
        "--hidden-size",
        "4096",
        "--world-size",
        "8",
        "-o",
        "ds.json",
        "--force",
    ],  # into --work
    "--help": ["--help"],
    "config --help": ["config", "--help"],
}


# Both sides may write and read their bytecode cache, as in a user's shell (a CI image may forbid it).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _wall(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=CHILD_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def commands(pairs: int, work: Path) -> dict:
    """Each quick command against `python -c pass`, in alternation, after one warm-up of each (the bytecode
    cache written, the files in the page cache)."""
    script = shutil.which("zero-kit", path=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    bare = [sys.executable, "-c", "pass"]
    out = {}
    for name, args in QUICK.items():
        argv = [script, *args]
        _wall(argv, work), _wall(bare, work)
        times = [(_wall(argv, work), _wall(bare, work)) for _ in range(pairs)]
        ratio = statistics.median(a / b for a, b in times)
        out[name] = {"command": " ".join(["zero-kit", *args]), "pairs": pairs, "ratio_median": round(ratio, 2),
                     "seconds_median": round(statistics.median(a for a, _ in times), 4),
                     "bare_seconds_median": round(statistics.median(b for _, b in times), 4)}  # fmt: skip
        print(f"{out[name]['command']}: {ratio:.2f}x python -c pass (median of {pairs} pairs; "
              f"{out[name]['seconds_median'] * 1000:.0f} ms against {out[name]['bare_seconds_median'] * 1000:.0f} ms)",
              flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("stages", "threads", "commands"))
    parser.add_argument("--jobs", default="default,llama-0.4b", help="stages: default, llama-0.4b, llama-0.4b+lora")
    parser.add_argument("--repeat", type=int, default=1, help="stages: runs per job")
    parser.add_argument("--pairs", type=int, default=2, help="threads, commands: A/B pairs")
    parser.add_argument("--steps", type=int, default=8, help="threads: steps per run")
    parser.add_argument("--work", default="build/startup", help="model dirs and runs (deleted by hand)")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    work = Path(args.work).absolute()
    work.mkdir(parents=True, exist_ok=True)
    record = {"environment": environment()}
    if args.what == "stages":
        record["stages"] = stages(args.jobs.split(","), args.repeat, work)
    elif args.what == "commands":
        record["commands"] = commands(args.pairs, work)
    else:
        record["threads"] = threads(args.pairs, args.steps, work)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d_%H%M', time.gmtime())}_{args.what}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

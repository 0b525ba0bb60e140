"""The planner's CPU peak per rank (what `zero-kit train` checks before it starts, zero_kit.train.guards.fit.rank_peak)
against the measured peak RSS of a one-rank CPU run, at three sequence lengths, on a LLaMA built from a config
with a 4,096-token context (random init; the embedded tokenizer; bundled data packed to the length; ZeRO-2, fp32,
micro batch 1, 2 optimizer steps).

    python -m benchmarks.plan_rss.run                           # 512, 2048, 4096; prints the table
    python -m benchmarks.plan_rss.run --lengths 512 --out benchmarks/plan_rss/results.jsonl

Peak RSS is the peak of the run's process tree, sampled every 20 ms with psutil (the child's ru_maxrss would start
from this process's size: Linux folds a forked copy's RSS into it at exec). A run past --kill-gib is killed and
recorded as such (the machine is shared). `zero-kit train` runs with --no-memory-check, so the plan decides
nothing here.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil

SHAPE = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=8, max_position_embeddings=4096, tie_word_embeddings=False)  # fmt: skip
GIB = 2**30


def model_dir(work: Path, shape: dict | None = None) -> Path:
    """The model directory, built once: random init of `shape` (default SHAPE), the embedded tokenizer."""
    target = work / "model"
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from zero_kit.model import load_tokenizer

    tokenizer = load_tokenizer(None)
    config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **(shape or SHAPE))  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def planned(model: Path, length: int) -> int:
    from zero_kit.train.guards.fit import cpu_view, rank_peak
    from zero_kit.train.options import TrainOptions
    from zero_kit.train.plan import Host, plan_run

    opts = TrainOptions(model=str(model), max_length=length, pack=True, micro_batch=1, stage=2)
    return rank_peak(cpu_view(plan_run(opts, {}, Host(on_gpu=False, bf16_supported=False))), on_gpu=False)


def measured(model: Path, length: int, work: Path, kill_gib: float) -> tuple[int, bool, float]:
    """Peak RSS of the run's process tree, whether it was killed past kill_gib, and its wall time."""
    cmd = [sys.executable, "-m", "zero_kit.cli", "train", "--model", str(model), "--max-length", str(length),
           "--pack", "--micro-batch", "1", "--stage", "2", "--max-steps", "2", "--no-export", "--no-memory-check",
           "--resume", "never", "--output", str(work / f"run{length}")]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root, peak, killed = psutil.Process(proc.pid), 0, False
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree))
        except psutil.Error:
            pass
        if peak > kill_gib * GIB:
            proc.kill()
            killed = True
        time.sleep(0.02)
    err = proc.stderr.read()
    if proc.returncode != 0 and not killed:
        raise SystemExit(f"run at {length} failed ({proc.returncode}):\n{err[-3000:]}")
    return peak, killed, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--work", type=Path, default=Path("/tmp/zk_plan_rss"))
    parser.add_argument("--out", type=Path, default=None, help="append one JSON line per length")
    parser.add_argument("--kill-gib", type=float, default=12.0)
    args = parser.parse_args()
    model = model_dir(args.work)
    import torch
    import transformers

    print("| --max-length | planned GiB | measured peak RSS GiB | planned / measured | wall s |")
    print("|---|---|---|---|---|")
    for length in args.lengths:
        plan = planned(model, length)
        peak, killed, wall = measured(model, length, args.work, args.kill_gib)
        ratio = plan / peak if peak else float("nan")
        print(f"| {length} | {plan / GIB:.2f} | {peak / GIB:.2f}{' (killed)' if killed else ''} | {ratio:.2f} | "
              f"{wall:.0f} |", flush=True)  # fmt: skip
        if args.out:
            record = {"length": length, "planned": plan, "peak_rss": peak, "killed": killed, "wall_s": round(wall, 1),
                      "shape": SHAPE, "torch": torch.__version__, "transformers": transformers.__version__,
                      "cpu": platform.processor() or platform.machine(), "cores": psutil.cpu_count(),
                      "date": time.strftime("%Y-%m-%d")}  # fmt: skip
            with args.out.open("a") as out:
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()

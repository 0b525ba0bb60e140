"""What `zero-kit train --sp 2` saves per rank on a long sequence (issue 48): each configuration trains a small
LLaMA (built here, random init, a 16,384-token context) at a short and a long --max-length, and a rank's memory for
the sequence is its peak RSS at the long length less its peak at the short one (the model, the libraries and the
states cancel out). sp=1 is one rank; sp=2 is two ranks on this host, ZeRO-3, fp32, micro batch 1.

    python -m benchmarks.long_sequences.memory                      # 256 and 8192; prints the table
    python -m benchmarks.long_sequences.memory --out benchmarks/long_sequences/results.jsonl

Each rank's peak RSS is sampled every 20 ms with psutil: the ranks are the processes running `zero_kit.cli train`
under the launcher (one rank: the process itself). Rows are plain text, each about --max-length tokens, so the long
run really holds long sequences; on CPU ranks --sp pads every batch to --max-length anyway (gloo). `zero-kit train`
runs with --no-memory-check (the planner does not model --sp yet).
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

from benchmarks.plan_rss.run import model_dir

SHAPE = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=16384, tie_word_embeddings=False)  # fmt: skip
GIB = 2**30
ROWS = 4


def append_record(path: Path | None, record: dict) -> None:
    """One JSON line of a run's figures with the versions, the hardware and the date (nothing without `path`)."""
    if path is None:
        return
    import torch
    import transformers

    stamp = {"shape": SHAPE, "torch": torch.__version__, "transformers": transformers.__version__,
             "cpu": platform.processor() or platform.machine(), "cores": psutil.cpu_count(),
             "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    with path.open("a") as out:
        out.write(json.dumps({**record, **stamp}) + "\n")


def data_file(work: Path, length: int) -> Path:
    """ROWS text rows of about 0.95 x `length` tokens each, cut from the bundled data's texts."""
    target = work / f"rows{length}.jsonl"
    if target.is_file():
        return target
    from zero_kit.model import load_tokenizer

    tokenizer = load_tokenizer(None)
    source = Path(__file__).resolve().parents[2] / "zero_kit" / "assets" / "data" / "text.jsonl"
    text = " ".join(json.loads(line)["text"] for line in source.read_text().splitlines())
    ids = tokenizer(text)["input_ids"]
    while len(ids) < ROWS * length:
        ids = ids + ids
    take = int(0.95 * length) - 4  # room for the special tokens the text format adds
    rows = [tokenizer.decode(ids[i * take : (i + 1) * take]) for i in range(ROWS)]
    target.write_text("".join(json.dumps({"text": row}) + "\n" for row in rows))
    return target


def train_argv(model: Path, data: Path, length: int, sp: int, out: Path, steps: int = 2, *extra: str) -> list[str]:
    """The study's `zero-kit train`: ZeRO-3, micro batch 1, `steps` steps, unchecked memory, no export; sp=1 one
    rank, else sp ranks in one group."""
    ranks = ["--nproc", str(sp), "--sp", str(sp)] if sp > 1 else []
    return [sys.executable, "-m", "zero_kit.cli", "train", "--model", str(model), "--data", str(data), "--format",
            "text", "--max-length", str(length), "--micro-batch", "1", "--stage", "3", "--max-steps", str(steps),
            "--no-export", "--no-memory-check", "--resume", "never", "--output", str(out), *ranks, *extra]  # fmt: skip


def measured(model: Path, data: Path, length: int, sp: int, out: Path) -> tuple[list[int], float]:
    """Peak RSS of each rank, and the run's wall time."""
    cmd = train_argv(model, data, length, sp, out)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root, peaks = psutil.Process(proc.pid), {}
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)] if sp > 1 else [root]
            for p in tree:
                if sp == 1 or "zero_kit.cli" in " ".join(p.cmdline()):
                    peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"sp={sp} at {length} failed ({proc.returncode}):\n{err[-3000:]}")
    return sorted(peaks.values(), reverse=True)[: max(sp, 1)], time.monotonic() - started


def study_arguments(doc: str, each: str, **numbers: int) -> argparse.Namespace:
    """The study's flags: `numbers` (name -> default), --work (models, data and runs, kept between runs) and --out
    (append one JSON line per `each`); the work folder made."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, default in numbers.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--work", type=Path, default=Path("/tmp/zk_long_sequences"))
    parser.add_argument("--out", type=Path, default=None, help=f"append one JSON line per {each}")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = study_arguments(__doc__, "configuration", short=256, long=8192)
    model = model_dir(args.work, SHAPE)
    deltas = {}
    print("| sp | ranks | peak RSS per rank at short, GiB | at long, GiB | long - short, GiB | wall s (long) |")
    print("|---|---|---|---|---|---|")
    for sp in (1, 2):
        short, _ = measured(model, data_file(args.work, args.short), args.short, sp, args.work / f"sp{sp}_short")
        long, wall = measured(model, data_file(args.work, args.long), args.long, sp, args.work / f"sp{sp}_long")
        deltas[sp] = max(b - a for a, b in zip(short, long, strict=True))
        print(f"| {sp} | {sp} | {max(short) / GIB:.2f} | {max(long) / GIB:.2f} | {deltas[sp] / GIB:.2f} | {wall:.0f} |",
              flush=True)  # fmt: skip
        append_record(args.out, {"sp": sp, "short": args.short, "long": args.long, "peak_rss_short": short,
                                 "peak_rss_long": long, "delta": deltas[sp], "wall_s_long": round(wall, 1),
                                 "stage": 3})  # fmt: skip
    print(f"\nsp=2 / sp=1 memory for the sequence, per rank: {deltas[2] / deltas[1]:.2f} (issue 48 asks <= 0.6)")


if __name__ == "__main__":
    main()

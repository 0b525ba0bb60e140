"""Issue 23 part 1, a quick measurement (not the full scale study): N alpaca rows (the shipped 272, repeated with a
row number appended so no two are equal) prepared into the data cache the way `zero-kit train` does, twice, then
loaded by R "ranks" at once; each rank reads every example once, as an epoch does.

    python -m benchmarks.data_scale.prepare --rows 200000 --ranks 2 --work /tmp/data_scale

Prints wall seconds of the first preparation (a fresh cache: rows read, Dataset.map, Arrow files written) and of the
second (key computed, entry found), each in a fresh process with its imports (the imports are timed apart), and per
rank the resident memory after imports and after the pass (VmRSS; RssAnon is the part that is the rank's alone:
the Arrow files are page cache shared by every rank).

Measured 2026-11-26 on the project's 2-core machine while other jobs kept its load average at 6-21 (so the first
preparation's time says little; the issue measured ~48 s per rank for the old per-rank tokenizing on a quieter
machine), Python 3.11, datasets 5.2.0, transformers 5.23.0, tokenizers 0.23.3, 200,000 rows (39 MB), two runs:

| step | wall (run 1, load ~17 / run 2, load ~9) | resident memory |
|---|---|---|
| first preparation (one process, Dataset.map with 2 processes) | 325 s / 162 s (+16 s / 9 s imports) | peak 502 / 596 MiB |
| second preparation (hash 39 MB, entry found) | 0.22 s / 0.08 s (+7 s / 5 s imports) | 159 MiB |
| each of 2 ranks: load + one pass over 200,000 rows (10.4M tokens) | | RssAnon +3 MiB, RssFile +94 MiB (shared) |
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PREPARE = """
import json, sys, time
t0 = time.monotonic()
from zero_kit.train.options import TrainOptions
from zero_kit.train import rundata
import datasets, transformers
t1 = time.monotonic()
entry = rundata.prepare(TrainOptions(data=sys.argv[1], data_cache=sys.argv[2]), speak=True).train
print(json.dumps({"imports_s": t1 - t0, "prepare_s": time.monotonic() - t1, "built": entry.built, "rss": rss()}))
"""
LOAD = """
import json, sys
from zero_kit.train.options import TrainOptions
from zero_kit.train import rundata
from zero_kit.model import load_tokenizer
import datasets, transformers
tokenizer = load_tokenizer(None)
before = rss()
prepared = rundata.prepare(TrainOptions(data=sys.argv[1], data_cache=sys.argv[2]), speak=False)
data = rundata.load(prepared, tokenizer)
tokens = sum(len(row["input_ids"]) for row in data.dataset)
print(json.dumps({"before": before, "after": rss(), "rows": len(data.dataset), "tokens": tokens}))
"""
RSS = """
def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) // 1024 for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}
"""


def make_rows(path: Path, count: int) -> None:
    from zero_kit.data.dataset import default_data_path

    base = [json.loads(line) for line in Path(default_data_path("alpaca")).read_text().splitlines() if line.strip()]
    with open(path, "w", encoding="utf-8") as out:
        for number in range(count):
            row = dict(base[number % len(base)])
            row["output"] = f"{row['output']} ({number})"
            out.write(json.dumps(row) + "\n")


def python(code: str, *args: str) -> dict:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", RSS + code, *args], capture_output=True, text=True, check=True)
    return {**json.loads(proc.stdout.splitlines()[-1]), "wall_s": round(time.monotonic() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--work", default="/tmp/data_scale")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data, cache = work / f"alpaca_{args.rows}.jsonl", work / f"cache_{time.time_ns()}"
    if not data.exists():
        make_rows(data, args.rows)
    print("first:", python(PREPARE, str(data), str(cache)), flush=True)
    print("second:", python(PREPARE, str(data), str(cache)), flush=True)
    ranks = [subprocess.Popen([sys.executable, "-c", RSS + LOAD, str(data), str(cache)], stdout=subprocess.PIPE,
                              text=True) for _ in range(args.ranks)]  # fmt: skip
    for rank, proc in enumerate(ranks):
        print(f"rank {rank} load:", proc.communicate()[0].strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()

"""Data at user scale (issue 23, part 2): time to first step on the first and the second start, and peak resident
memory per rank, for 10k, 100k and 1M alpaca rows; beside it LLaMA-Factory's preprocessing of the same rows.

    python -m benchmarks.data_scale.run                                  # 10k, 100k, 1M rows; zero_kit and the peer
    python -m benchmarks.data_scale.run --rows 10000 --side zero_kit     # one size, one side
    python -m benchmarks.data_scale.run --peer-python build/venv-peer/bin/python

zero_kit: `zero-kit train --nproc 2 --stage 3 --max-steps 1` on the embedded tiny model, started twice with the same
inputs (the second start may reuse what the first prepared). The peer: benchmarks/data_scale/peer.py in its own
venv (LLaMA-Factory pins its own transformers), started twice on a fresh datasets cache. Rows are the shipped 272
alpaca rows, repeated with a counter in each instruction (no downloads). Results: results/<date>.json, and the
table in results/README.md (written by --table).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.startup.measure import environment, train

HERE = Path(__file__).resolve().parent
SIZES = (10_000, 100_000, 1_000_000)
ZERO_KIT_ARGS = ["--nproc", "2", "--stage", "3", "--max-steps", "1", "--no-export", "--resume", "never"]


def make_rows(count: int, path: Path) -> Path:
    """`count` alpaca rows: the shipped ones in turn, each instruction numbered so no two rows are equal."""
    from zero_kit.data.dataset import default_data_path

    if path.is_file():
        return path
    base = [json.loads(line) for line in Path(default_data_path("alpaca")).read_text().splitlines() if line.strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with open(partial, "w") as out:
        for index in range(count):
            row = dict(base[index % len(base)])
            row["instruction"] = f"{row['instruction']} (case {index})"
            out.write(json.dumps(row) + "\n")
    partial.rename(path)
    return path


def zero_kit_side(rows: int, data: Path, work: Path) -> dict:
    """Two starts with the same inputs; a data cache of their own (where zero_kit has one), empty before the first."""
    from zero_kit.train.options import TrainOptions

    output, args = work / f"run_{rows}", [*ZERO_KIT_ARGS, "--data", str(data)]
    if hasattr(TrainOptions, "data_cache"):
        cache = work / f"data_cache_{rows}"
        shutil.rmtree(cache, ignore_errors=True)
        args += ["--data-cache", str(cache)]
    starts = {}
    for start in ("first", "second"):
        starts[start] = train(args, output, work / f"zero_kit_{rows}_{start}.log")
        print(f"zero_kit {rows} rows, {start} start: {_summary(starts[start])}", flush=True)
    return starts


def peer_side(rows: int, data: Path, work: Path, peer_python: str) -> dict:
    cache = work / f"peer_cache_{rows}"
    shutil.rmtree(cache, ignore_errors=True)  # the first start finds nothing prepared
    starts = {}
    for start in ("first", "second"):
        cmd = [peer_python, str(HERE / "peer.py"), "--data", str(data), "--cache", str(cache)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            starts[start] = {"exit_code": proc.returncode, "stderr_tail": proc.stderr[-2000:]}
        else:
            starts[start] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"peer {rows} rows, {start} start: {starts[start]}", flush=True)
    return starts


def _summary(result: dict) -> str:
    startup = result.get("startup") or {}
    data_s = (startup.get("stages_s") or {}).get("data")
    return (
        f"exit {result['exit_code']}, wall {result['wall_s']} s, time to first step "
        f"{startup.get('time_to_first_step_s')} s (data {data_s} s), peak RSS per rank {result['peak_rss_mib_per_rank']} MiB"
    )


def table(record: dict) -> str:
    """The markdown table of a results JSON: per size, each side's first and second start."""
    lines = [
        "| rows | start | zero_kit: time to first step | of it: prepare + data | peak RSS per rank "
        "| data stage, rank 0: + resident / + private | CPU s per rank "
        "| LLaMA-Factory: preprocessing | its imports | its peak RSS (main / largest worker) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rows, entry in record["sizes"].items():
        for start in ("first", "second"):
            ours = (entry.get("zero_kit") or {}).get(start) or {}
            peer = (entry.get("peer") or {}).get(start) or {}
            stages = (ours.get("startup") or {}).get("stages_s") or {}
            ttfs = (ours.get("startup") or {}).get("time_to_first_step_s")
            data = stages.get("prepare", 0) + stages.get("data", 0) if stages else None
            lines.append(
                f"| {int(rows):,} | {start} | {_s(ttfs)} | {_s(data)} | {_list(ours.get('peak_rss_mib_per_rank'), 'MiB')} "
                f"| {_data_growth(ours.get('startup') or {})} | {_list(ours.get('cpu_s_per_rank'), 's')} | {_s(peer.get('preprocess_s'))} | {_s(peer.get('imports_s'))} "
                f"| {_list([peer.get('peak_rss_mib'), peer.get('peak_rss_mib_largest_worker')], 'MiB')} |"
            )
    return "\n".join(lines)


def merged(paths: list[str]) -> dict:
    """Results files of one study (say a zero_kit side and a peer side run apart) as one record, size by size."""
    record: dict = {"sizes": {}}
    for path in paths:
        for rows, entry in json.loads(Path(path).read_text())["sizes"].items():
            record["sizes"].setdefault(rows, {}).update(entry)
    return record


def _data_growth(startup: dict) -> str:
    """Rank 0's memory growth over the data stage (from the model stage's end): resident, and of it private (the
    rest is file pages: the memory-mapped entry, shared by the ranks)."""
    growth = []
    for key in ("rss_mib_after", "private_mib_after"):
        after = startup.get(key) or {}
        growth.append(f"+{after['data'] - after['model']:.0f}" if {"data", "model"} <= after.keys() else "-")
    return " / ".join(growth) + " MiB"


def _s(value) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _list(values, unit: str) -> str:
    values = [v for v in values or [] if v is not None]
    return " / ".join(f"{v:g}" for v in values) + f" {unit}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(map(str, SIZES)), help="comma-separated row counts")
    parser.add_argument("--side", choices=("both", "zero_kit", "peer"), default="both")
    parser.add_argument("--peer-python", default="build/venv-peer/bin/python", help="the peer venv's python")
    parser.add_argument("--work", default="build/data_scale", help="rows, runs and caches (deleted by hand)")
    parser.add_argument("--out", default=str(HERE / "results"), help="where the JSON goes")
    parser.add_argument(
        "--table",
        default=None,
        metavar="RESULTS_JSON[,...]",
        help="print the table of results files (one side each, or both)",
    )
    args = parser.parse_args(argv)
    if args.table:
        print(table(merged(args.table.split(","))))
        return 0
    work = Path(args.work).absolute()
    work.mkdir(parents=True, exist_ok=True)
    record = {"environment": environment(), "zero_kit_args": ZERO_KIT_ARGS, "sizes": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d_%H%M', time.gmtime())}_{args.side}.json"
    for rows in (int(r) for r in args.rows.split(",")):
        data = make_rows(rows, work / f"alpaca_{rows}.jsonl")
        entry = record["sizes"].setdefault(str(rows), {"file_mib": round(data.stat().st_size / 2**20, 1)})
        if args.side in ("both", "zero_kit"):
            entry["zero_kit"] = zero_kit_side(rows, data, work)
        if args.side in ("both", "peer"):
            entry["peer"] = peer_side(rows, data, work, args.peer_python)
        path.write_text(json.dumps(record, indent=1) + "\n")  # after each size: a long run cut short keeps its figures
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

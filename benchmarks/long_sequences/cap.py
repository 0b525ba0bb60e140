"""The longest sequence that trains under a fixed per-rank memory cap (issue 48): one rank at sp=1 against two ranks
with `--sp 2 --tiled-compute`, each measured and each as the memory guard plans it.

    python -m benchmarks.long_sequences.cap --cap_gib 3 --out benchmarks/long_sequences/cap.jsonl

The cap is an address-space limit (RLIMIT_AS, `ulimit -v`) that every process of the run inherits, so each rank
has at most --cap_gib; a rank past it gets a failed allocation (torch's RuntimeError), not the OOM killer. The
memory guard knows the cap (`zero_kit.train.guards.fit.available_host_bytes`: the cap less what a rank maps beyond
what it holds): its longest fitting length is found by bisection over its own figure (`rank_peak`), in-process. The
measured longest is found by real runs, `zero-kit train ... --no-memory-check --max-steps 1`, from the guard's
length up (x1.25) or down until a run fails or trains, then bisected to within --resolution. The model and the data
are those of memory.py (a LLaMA of hidden 128, 2 layers, 4 heads, built here, with a longer context), ZeRO-3, fp32,
micro batch 1.
"""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path

from benchmarks.long_sequences.memory import SHAPE, append_record, data_file, study_arguments, train_argv
from benchmarks.plan_rss.run import model_dir

GIB = 2**30
CONTEXT = 262144
RUNS = {"sp1": (1, False), "sp2_tiled": (2, True)}
"""name -> (sp, tiled compute)"""
RESOLUTION = 0.06
"""The measured longest is bisected until the next length up that failed is within this fraction of it."""


def planned_peak(model: Path, length: int, sp: int, tiled: bool) -> int:
    """The memory guard's peak per rank for the run at `length` (what `zero-kit train` compares with the cap)."""
    from zero_kit.train.guards.fit import cpu_view, rank_peak
    from zero_kit.train.options import TrainOptions
    from zero_kit.train.plan import Host, plan_run

    opts = TrainOptions(model=str(model), max_length=length, micro_batch=1, stage=3, sp=sp, tiled_compute=tiled,
                        nproc=sp, precision="fp32")  # fmt: skip
    view = cpu_view(plan_run(opts, {}, Host(on_gpu=False, bf16_supported=False)))
    return rank_peak(view, on_gpu=False)


def planned_longest(model: Path, sp: int, tiled: bool, cap: int, step: int) -> int:
    """The longest multiple of `step` whose planned peak fits the cap as the guard reads it."""
    from zero_kit.train.guards.fit import rank_cap_bytes

    usable = rank_cap_bytes(cap)
    low, high = step, step
    while planned_peak(model, high, sp, tiled) <= usable and high < CONTEXT:
        low, high = high, high * 2
    while high - low > step:
        mid = (low + high) // 2 // step * step
        low, high = (mid, high) if planned_peak(model, mid, sp, tiled) <= usable else (low, mid)
    return low


def trains(model: Path, work: Path, length: int, sp: int, tiled: bool, cap: int) -> tuple[bool, float, str]:
    """A real run at `length` under the cap: whether it trained, its wall time, its last error line."""
    out = work / f"cap_run_{sp}_{int(tiled)}_{length}"
    extra = ["--precision", "fp32", "--overwrite-output", *(["--tiled-compute"] if tiled else [])]
    cmd = train_argv(model, data_file(work, length), length, sp, out, 1, *extra)

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    started = time.monotonic()
    proc = subprocess.run(cmd, preexec_fn=capped, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower() or "memory" in line.lower()]
    return proc.returncode == 0, wall, (errors[-1] if errors else proc.stderr[-300:]).strip()


def measured_longest(model: Path, work: Path, sp: int, tiled: bool, cap: int, start: int, step: int,
                     resolution: float, log) -> int:  # fmt: skip
    """The longest multiple of `step` that trains under the cap, to within `resolution` (a fraction), starting
    from `start` (the guard's figure)."""
    tried: dict[int, bool] = {}

    def probe(length: int) -> bool:
        if length not in tried:
            ok, wall, said = trains(model, work, length, sp, tiled, cap)
            tried[length] = ok
            log({"sp": sp, "tiled": tiled, "length": length, "trained": ok, "wall_s": round(wall, 1),
                 "said": "" if ok else said})  # fmt: skip
        return tried[length]

    length = max(step, start // step * step)
    if probe(length):
        low, high = length, None
        while high is None and low < CONTEXT:
            grown = min(CONTEXT, int(low * 1.25) // step * step)
            low, high = (grown, None) if probe(grown) else (low, grown)
        high = high or CONTEXT
    else:
        low, high = None, length
        while low is None and high > step:
            shrunk = max(step, int(high / 1.25) // step * step)
            low, high = (shrunk, high) if probe(shrunk) else (None, shrunk)
        if low is None:
            return 0
    while (high - low) / low > resolution and high - low > step:
        mid = (low + high) // 2 // step * step
        low, high = (mid, high) if probe(mid) else (low, mid)
    return low


def main() -> None:
    args = study_arguments(__doc__, "run", cap_gib=3, step=256)
    cap = int(args.cap_gib * GIB)
    model = model_dir(args.work / f"context{CONTEXT}", {**SHAPE, "max_position_embeddings": CONTEXT})
    found = {}
    for name, (sp, tiled) in RUNS.items():
        step = args.step * sp
        planned = planned_longest(model, sp, tiled, cap, step)
        print(f"{name}: the memory guard plans up to {planned:,} tokens under {args.cap_gib} GiB per rank", flush=True)

        def log(record: dict, name: str = name) -> None:
            print(f"  {name} at {record['length']:,}: {'trained' if record['trained'] else 'failed'} "
                  f"({record['wall_s']} s) {record['said']}", flush=True)  # fmt: skip
            append_record(args.out, {"study": "cap", "cap_gib": args.cap_gib, "run": name, **record})

        longest = measured_longest(model, args.work, sp, tiled, cap, planned, step, RESOLUTION, log)
        found[name] = (planned, longest)
        print(f"{name}: longest trained {longest:,} tokens; planned {planned:,} ({planned / longest - 1:+.0%})",
              flush=True)  # fmt: skip
        append_record(args.out, {"study": "cap", "cap_gib": args.cap_gib, "run": name, "planned_longest": planned,
                                 "measured_longest": longest})  # fmt: skip
    ratio = found["sp2_tiled"][1] / max(found["sp1"][1], 1)
    print(f"\n--sp 2 --tiled-compute trains {ratio:.1f}x the longest sequence of one rank (issue 48 asks >= 4x)")


if __name__ == "__main__":
    main()

"""The recorded CPU comparison: DDP, FSDP2 and ZeRO-1/2/3 (plus the two DeepSpeed variants that explain its
traffic) on 2 CPU ranks with gloo, fp32, the embedded tiny LLaMA, 20 steps. Run from the repository root:

    OMP_NUM_THREADS=1 python -m benchmarks.compare_cpu.run

which is exactly

    zero-kit bench --strategies ddp,fsdp,zero1,zero2,zero3,zero2_reduce,zero3_release --nproc 2 --steps 20 \\
        --warmup 3 --precision fp32 --out benchmarks/compare_cpu/results_2ranks

and writes results.jsonl, table.md, throughput.png, memory.png and loss.png under
benchmarks/compare_cpu/results_2ranks. Add `--nproc 4 --steps 20 --out benchmarks/compare_cpu/results_4ranks`
(as arguments to this script; the last of a repeated flag wins) for the 4-rank accounting run.
"""

from __future__ import annotations

import sys

ARGS = ["bench", "--strategies", "ddp,fsdp,zero1,zero2,zero3,zero2_reduce,zero3_release", "--nproc", "2",
        "--steps", "20", "--warmup", "3", "--precision", "fp32", "--out", "benchmarks/compare_cpu/results_2ranks"]  # fmt: skip


if __name__ == "__main__":  # every argument goes on to `zero-kit bench` (--help prints its flags)
    from zero_kit.cli import main

    sys.exit(main(ARGS + sys.argv[1:]))

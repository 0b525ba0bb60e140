"""Single-GPU comparison for a ~1B-parameter LLaMA-architecture model at sequence length 2048, bf16, SDPA:
plain PyTorch (ddp at world size 1) against ZeRO-0..3 and the optimizer-offload variants; reports MFU (peak
table in zero_kit/metrics.py) and CUDA peak allocated/reserved memory. Needs a LLaMA config directory (random
init, nothing downloaded), e.g. a copy of Llama-3.2-1B's config.json at models/llama-1b. On the GPU machine:

    python -m benchmarks.compare_gpu_1b.run --model models/llama-1b --out benchmarks/compare_gpu_1b/results_h100

which is `zero-kit bench --strategies ddp,zero0,zero1,zero2,zero3,zero2_offload,zero3_offload --nproc 1
--precision bf16 --seq-len 2048 --micro-batch 1 --steps 20 --warmup 5` plus the arguments given here.
Not yet recorded: no GPU was lent to the session that wrote it.
"""

from __future__ import annotations

import sys

ARGS = ["bench", "--strategies", "ddp,zero0,zero1,zero2,zero3,zero2_offload,zero3_offload", "--nproc", "1",
        "--precision", "bf16", "--seq-len", "2048", "--micro-batch", "1", "--steps", "20", "--warmup", "5"]  # fmt: skip


if __name__ == "__main__":  # every argument goes on to `zero-kit bench` (--help prints its flags)
    from zero_kit.cli import main

    sys.exit(main(ARGS + sys.argv[1:]))

"""The frame of a probe that runs as each rank of a real `deepspeed` launch (hf_cpu_traps_probe.py,
hf_zero3_batch_probe.py): its command line, the record each rank writes, and how the rank ends.

    deepspeed --num_gpus 2 --master_port P tests/dist/PROBE.py --config CFG --out DIR

A probe imports it as a sibling module: the launcher runs the probe's file, whose folder Python puts first on
sys.path."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

from zero_kit.dist import end_process_group, exit_rank
from zero_kit.launch.ops import skip_shm_op


def run_rank(probe: Callable[[str, Path], dict]) -> None:
    """Read --config CFG and --out DIR (and the --local_rank the launcher adds), write DIR/rank{R}.json with what
    `probe(CFG, DIR)` recorded, end the process group with the other ranks, then leave without interpreter teardown
    (which can abort on a DeepSpeed rank: see zero_kit.dist)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    cli = parser.parse_args()
    out = Path(cli.out)
    skip_shm_op()  # what zero-kit's ranks do: no unused shm op, nothing left in /dev/shm
    record = probe(cli.config, out)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(record, indent=1))
    end_process_group(finished=True)
    exit_rank(0)

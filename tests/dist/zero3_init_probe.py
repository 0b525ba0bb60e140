"""Build models with zero_kit.model.load_model under an HfDeepSpeedConfig for ZeRO-3 and record what each rank really holds.

    deepspeed --num_gpus 2 --master_port 29680 tests/dist/zero3_init_probe.py --out DIR

Builds it twice under ZeRO-3: the default from its config, and from_pretrained of a directory saved without
ZeRO. Writes DIR/rank{R}.json with, for each: the full parameter count (sum of ds_numel), the elements this
rank stores (sum of ds_tensor.numel()), how many parameters still have local data (p.numel() > 0), and
checksums of the gathered weights; plus the checksums of the same seed built without ZeRO.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import deepspeed
import torch

from zero_kit.dist import end_process_group, exit_rank
from zero_kit.launch.ops import skip_shm_op
from zero_kit.model import count_parameters, load_model


def checksum(model) -> list[float]:
    """Per-parameter sums weighted by position: equal lists mean equal weights for any practical purpose."""
    return [
        float((p.detach().double().flatten() * torch.arange(1, p.numel() + 1, dtype=torch.float64)).sum())
        for p in model.parameters()
    ]


def partition_record(model) -> dict:
    params = list(model.parameters())
    record = {
        "full_params": count_parameters(model),
        "stored_elements": sum(p.ds_tensor.numel() for p in params),
        "params_with_local_data": sum(p.numel() > 0 for p in params),
        "params_partitioned": sum(hasattr(p, "ds_id") for p in params),
        "param_count": len(params),
    }
    with deepspeed.zero.GatheredParameters(params):
        record["checksum"] = checksum(model)
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    skip_shm_op()  # what zero-kit's ranks do: no unused shm op, nothing left in /dev/shm
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    saved = Path(args.out, "saved")
    plain = load_model(None, seed=0)  # no ZeRO yet: the reference weights, also saved as a model directory
    record = {
        "rank": rank,
        "plain_params": sum(p.numel() for p in plain.parameters()),
        "checksum_plain": checksum(plain),
    }
    if rank == 0:
        plain.save_pretrained(saved)
    del plain
    torch.distributed.barrier()
    from transformers.integrations import HfDeepSpeedConfig

    config = {"train_micro_batch_size_per_gpu": 1, "train_batch_size": world, "zero_optimization": {"stage": 3}}
    keep_alive = HfDeepSpeedConfig(config)  # transformers holds only a weak reference to it
    record["default"] = partition_record(load_model(None, seed=0))
    record["from_dir"] = partition_record(load_model(str(saved)))
    del keep_alive
    gc.collect()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(record))
    end_process_group(finished=True)


if __name__ == "__main__":
    main()
    exit_rank(0)  # interpreter teardown of a ZeRO-3 rank can abort (see there)

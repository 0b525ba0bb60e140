"""Under ZeRO-3 (HfDeepSpeedConfig alive), load_model builds the model partitioned: no rank holds it whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import shm_left

PROBE = Path(__file__).with_name("zero3_init_probe.py")
MASTER_PORT = "29680"  # this test's own port


@pytest.mark.dist
def test_zero3_init_partitions_default_model_across_two_ranks(tmp_path):
    deepspeed = Path(sys.executable).with_name("deepspeed")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [str(deepspeed), "--num_gpus", "2", "--master_port", MASTER_PORT, str(PROBE), "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert shm_left(MASTER_PORT) == []  # the probe keeps DeepSpeed's unused shm op from starting, as zero-kit does
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    full = records[0]["plain_params"]
    for record in records:
        for built in ("default", "from_dir"):
            held = record[built]
            assert held["full_params"] == full  # count_parameters sees the full size through ds_numel
            assert held["params_partitioned"] == held["param_count"]
            assert held["params_with_local_data"] == 0  # every p.data was released after partitioning
            # each rank stores about half (partitions are padded to a multiple of the world size)
            assert full / 2 <= held["stored_elements"] <= full / 2 + held["param_count"] * 2
            # same weights as the same seed built without ZeRO (so DDP/FSDP/ZeRO comparisons start equal)
            assert held["checksum"] == record["checksum_plain"], built
    stored = [r["default"]["stored_elements"] for r in records]
    print(f"\nZeRO-3 init: full {full} params; elements stored per rank {stored}")

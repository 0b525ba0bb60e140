"""DeepSpeed's shm all-reduce op (loaded by init_distributed on CPU when every rank is on one host) creates a 66 MB
POSIX shared-memory file per rank and never removes it: every DeepSpeed run on CPU left ranks x 66 MB of RAM in
/dev/shm. zero_kit's init (zero_kit.launch.ops.init_distributed, used by train, bench and zero_kit.hf) removes the
names once every rank has mapped them. Real `deepspeed` launcher, 2 CPU ranks: the files exist after DeepSpeed's own
init (the leak is real), are gone after the release, the shm op still reduces on the mappings, and nothing of the
run is left in /dev/shm after it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.jobs import env, start
from zero_kit.dist import free_port
from zero_kit.launch.ops import shm_buffer

PROBE = Path(__file__).with_name("shm_release_probe.py")


@pytest.mark.dist
@pytest.mark.serial  # counts every /dev/shm file: never beside another test
def test_the_shm_ops_files_are_gone_once_every_rank_mapped_them(tmp_path):
    port = str(free_port())
    deepspeed = Path(sys.executable).with_name("deepspeed")
    job = start([str(deepspeed), "--num_gpus", "2", "--master_port", port, str(PROBE)], tmp_path / "probe.log",
                env=env(OMP_NUM_THREADS="1"), reap=True)  # fmt: skip
    assert job.wait(timeout=240) == 0, job.text()[-3000:]
    text = job.text()
    for rank in (0, 1):
        assert f"rank {rank}: after init, own buffer True" in text, text[-3000:]  # DeepSpeed made it
        assert f"rank {rank}: released True, own buffer False" in text, text[-3000:]
        assert f"rank {rank}: shm all-reduce sum [3.0]" in text, text[-3000:]  # 1 + 2, through the shm kernel
    left = [shm_buffer(rank, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for rank in (0, 1)]
    assert not [path for path in left if path.exists()], left

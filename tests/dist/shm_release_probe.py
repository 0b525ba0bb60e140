"""One rank of tests/dist/test_shm_release.py: DeepSpeed's own init_distributed on CPU (which loads the shm all-reduce
op and creates this rank's shared-memory workspace), then zero_kit's release of its name, then an all-reduce through
the shm op itself, which must still work on the mappings."""

import deepspeed
import torch
import torch.distributed as dist

from zero_kit.launch.ops import guard_op_builds, release_shm_buffer, shm_buffer

guard_op_builds()
deepspeed.init_distributed("gloo")
rank = dist.get_rank()
print(f"rank {rank}: after init, own buffer {shm_buffer(rank).exists()}", flush=True)
print(f"rank {rank}: released {release_shm_buffer()}, own buffer {shm_buffer(rank).exists()}", flush=True)
values = torch.full((4096,), float(rank + 1))
torch.ops.deepspeed.inference_all_reduce_(values)  # the shm kernel itself, on the other rank's mapped workspace
print(f"rank {rank}: shm all-reduce sum {values.unique().tolist()}")

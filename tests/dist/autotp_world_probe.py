"""One rank of tests/dist/test_autotp_world.py: DeepSpeed's own AutoTP group set-up (groups._init_tp_mesh_device, as
the engine calls it for tensor_parallel.autotp_size) at the tensor-parallel size given last (the launcher puts --local_rank first), on gloo."""

import sys

import deepspeed
from deepspeed.utils import groups

from zero_kit.launch.ops import skip_shm_op

skip_shm_op()  # what zero-kit's ranks do: no unused shm op, nothing left in /dev/shm
deepspeed.init_distributed("gloo")
groups._init_tp_mesh_device(tensor_model_parallel_size=int(sys.argv[-1]))
tp_ranks = deepspeed.comm.get_world_size(group=groups.get_tensor_model_parallel_group())
print(f"rank {deepspeed.comm.get_rank()}: tp group of {tp_ranks} up")

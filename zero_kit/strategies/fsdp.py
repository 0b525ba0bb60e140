"""PyTorch FSDP2 (`fully_shard`): each transformer block sharded, then the root; parameters, gradients and
optimizer state are DTensors whose local shards are what this rank holds.

Hierarchies (zero_kit.strategies.StrategyInfo.hierarchy), with L ranks per node and M = N / L nodes:
- hsdp: a 2D mesh ("replicate", "shard") of shape (M, L), ranks in row-major order, so a node's ranks form one
  shard group: all-gathers and reduce-scatters stay in the node and the reduced gradient shard is all-reduced
  across nodes (torch `_fsdp_collectives.foreach_reduce`: `all_reduce_group` is the replicate group).
- reshard_node: `reshard_after_forward=L` on every block: after forward a block keeps the shard of a
  node-sized group (`_fsdp_init._get_post_forward_mesh_info` views the mesh as (-1, L)), and the backward
  all-gather runs over that group. torch turns L == N into True and L == 1 into False.
The root keeps torch's default (not resharded after forward) in all three."""

from __future__ import annotations

from typing import Any

from zero_kit.metrics import storage_bytes
from zero_kit.strategies.base import Strategy as _Base
from zero_kit.strategies.base import StrategyOptions, clip_and_step, make_optimizer, optimizer_state_tensors


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class FSDPStrategy(_Base):
    name = "fsdp"

    def __init__(self, model, options: StrategyOptions, *, name: str = "fsdp", hierarchy: str = "flat") -> None:
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.options, self.name, self.hierarchy = options, name, hierarchy
        model = model.to(options.device)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.precision)
        policy = (
            MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        )
        mesh, block_reshard = self._mesh_and_reshard(options)
        for block in model.model.layers:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=block_reshard)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self.module = model
        self.run = torch.compile(model) if options.compile else model
        self.optimizer = make_optimizer(model.parameters(), options)

    def _mesh_and_reshard(self, options: StrategyOptions):
        """(device mesh or None for the default 1D one, reshard_after_forward of the blocks)."""
        node = min(options.ranks_per_node or options.world_size, options.world_size)
        if self.hierarchy == "flat":
            return None, None  # torch default: True for blocks
        if self.hierarchy == "reshard_node":
            return None, node
        if self.hierarchy == "hsdp":
            from torch.distributed.device_mesh import init_device_mesh

            device_type = "cuda" if options.device.startswith("cuda") else "cpu"
            shape = (options.world_size // node, node)
            return init_device_mesh(device_type, shape, mesh_dim_names=("replicate", "shard")), None
        raise ValueError(f"unknown FSDP2 hierarchy {self.hierarchy!r}; choose from flat, hsdp, reshard_node")

    def forward(self, batch: dict[str, Any], last: bool):
        # FSDP2's accumulation switch: skip reduce-scatter on micro steps, unsharded grads accumulate locally.
        self.module.set_requires_gradient_sync(last)
        return self.run(**batch).loss

    def backward(self, loss, last: bool) -> None:
        (loss / self.options.grad_accum).backward()

    def step(self) -> None:
        clip_and_step(self.module, self.optimizer, self.options.gradient_clipping, set_to_none=True)

    def grad_bytes(self) -> int:
        return storage_bytes(_local(p.grad) for p in self.module.parameters() if p.grad is not None)

    def param_and_optimizer_bytes(self) -> tuple[int, int]:
        params = storage_bytes(_local(p) for p in self.module.parameters())
        return params, storage_bytes(_local(t) for t in optimizer_state_tensors(self.optimizer))

    def notes(self) -> str:
        where = {"hsdp": "node-sized shard group, replicated across nodes", "reshard_node": "world size"}
        return (
            "local shards of DTensor params/grads/AdamW state (padded along dim 0 to the shard group's size: "
            f"{where.get(self.hierarchy, 'world size')})"
        )

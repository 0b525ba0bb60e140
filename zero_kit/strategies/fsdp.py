"""PyTorch FSDP2 (`fully_shard`): each transformer block sharded, then the root; parameters, gradients and
optimizer state are DTensors whose local shards are what this rank holds."""

from __future__ import annotations

from typing import Any

from zero_kit.metrics import storage_bytes
from zero_kit.strategies.base import Strategy as _Base
from zero_kit.strategies.base import StrategyOptions, clip_and_step, make_optimizer, optimizer_state_tensors


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class FSDPStrategy(_Base):
    name = "fsdp"

    def __init__(self, model, options: StrategyOptions) -> None:
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.options = options
        model = model.to(options.device)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.precision)
        policy = (
            MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        )
        for block in model.model.layers:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        self.module = model
        self.run = torch.compile(model) if options.compile else model
        self.optimizer = make_optimizer(model.parameters(), options)

    def forward_backward(self, batch: dict[str, Any], last: bool) -> float:
        # FSDP2's accumulation switch: skip reduce-scatter on micro steps, unsharded grads accumulate locally.
        self.module.set_requires_gradient_sync(last)
        loss = self.run(**batch).loss
        (loss / self.options.grad_accum).backward()
        return loss.item()

    def step(self) -> None:
        clip_and_step(self.module, self.optimizer, self.options.gradient_clipping, set_to_none=True)

    def grad_bytes(self) -> int:
        return storage_bytes(_local(p.grad) for p in self.module.parameters() if p.grad is not None)

    def param_and_optimizer_bytes(self) -> tuple[int, int]:
        params = storage_bytes(_local(p) for p in self.module.parameters())
        return params, storage_bytes(_local(t) for t in optimizer_state_tensors(self.optimizer))

    def notes(self) -> str:
        return "local shards of DTensor params/grads/AdamW state (padded to world size along dim 0)"

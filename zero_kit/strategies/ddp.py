"""PyTorch DistributedDataParallel: full replicas, gradients all-reduced in buckets during backward."""

from __future__ import annotations

import contextlib
from typing import Any

from zero_kit.metrics import storage_bytes
from zero_kit.strategies.base import Strategy as _Base
from zero_kit.strategies.base import StrategyOptions, clip_and_step, make_optimizer, optimizer_state_tensors


class DDPStrategy(_Base):
    name = "ddp"

    def __init__(self, model, options: StrategyOptions) -> None:
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        self.options = options
        model = model.to(options.device)
        # gradient_as_bucket_view: grads live inside the all-reduce buckets instead of a second copy.
        self.ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        # The stock all-reduce hook does what the C++ reducer does by default (average, all-reduce the bucket)
        # but calls torch.distributed.all_reduce from Python, so the benchmark's byte counter sees it.
        self.ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        self.module = self.ddp.module
        self.run = torch.compile(self.ddp) if options.compile else self.ddp
        self.optimizer = make_optimizer(self.module.parameters(), options)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.precision)
        device_type = "cuda" if options.device.startswith("cuda") else "cpu"
        self._autocast = (lambda: torch.autocast(device_type, dtype=dtype)) if dtype else contextlib.nullcontext

    def forward_backward(self, batch: dict[str, Any], last: bool) -> float:
        # no_sync skips the all-reduce on accumulation micro steps; the last one reduces the summed grads.
        sync = contextlib.nullcontext() if last else self.ddp.no_sync()
        with sync:
            with self._autocast():
                loss = self.run(**batch).loss
            (loss / self.options.grad_accum).backward()
        return loss.item()

    def step(self) -> None:
        clip_and_step(
            self.module, self.optimizer, self.options.gradient_clipping, set_to_none=False
        )  # keep the bucket views alive (set_to_none would drop them)

    def grad_bytes(self) -> int:
        return storage_bytes(p.grad for p in self.module.parameters())

    def param_and_optimizer_bytes(self) -> tuple[int, int]:
        params = storage_bytes(self.module.parameters())
        return params, storage_bytes(optimizer_state_tensors(self.optimizer))

    def notes(self) -> str:
        return "full fp32 replica; grads are views into DDP's all-reduce buckets; AdamW exp_avg+exp_avg_sq"

"""PyTorch DistributedDataParallel: full replicas, gradients all-reduced in buckets during backward.

The comm hook is torch's stock all-reduce hook (average, all-reduce the bucket asynchronously) written out, so the
collective goes through torch.distributed in Python where the bench's counter sees it; the last bucket's hook also
queues a callback at the end of backward that waits on every bucket's Work from Python, just before DDP's C++
reducer waits on their futures (finalize_backward). The waits are the same; they become visible to the counter's
timing (metrics.py: what DDP could not hide behind backward)."""

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
        from torch.nn.parallel import DistributedDataParallel

        self.options = options
        model = model.to(options.device)
        # gradient_as_bucket_view: grads live inside the all-reduce buckets instead of a second copy.
        self.ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        # The stock all-reduce hook does what the C++ reducer does by default (average, all-reduce the bucket)
        # but calls torch.distributed.all_reduce from Python, so the benchmark's byte counter sees it (module doc).
        self.ddp.register_comm_hook(WaitedAllReduce(None), WaitedAllReduce.hook)
        self.module = self.ddp.module
        self.run = torch.compile(self.ddp) if options.compile else self.ddp
        self.optimizer = make_optimizer(self.module.parameters(), options)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.precision)
        device_type = "cuda" if options.device.startswith("cuda") else "cpu"
        self._autocast = (lambda: torch.autocast(device_type, dtype=dtype)) if dtype else contextlib.nullcontext
        self._sync = contextlib.ExitStack()

    def forward(self, batch: dict[str, Any], last: bool):
        # no_sync skips the all-reduce on accumulation micro steps; the last one reduces the summed grads. The
        # context is held from this forward to the end of its backward, as `with ddp.no_sync(): fwd; bwd` would.
        self._sync = contextlib.ExitStack()
        if not last:
            self._sync.enter_context(self.ddp.no_sync())
        with self._autocast():
            return self.run(**batch).loss

    def backward(self, loss, last: bool) -> None:
        try:
            (loss / self.options.grad_accum).backward()
        finally:
            self._sync.close()

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


class WaitedAllReduce:
    """DDP comm hook state: torch's `default_hooks.allreduce_hook` (bucket divided by the group size, all-reduced
    with async_op=True, the future's tensor returned), and at the last bucket a callback queued on the autograd
    engine that waits on every bucket's Work from Python before DDP's reducer does (module doc). `group` None is
    the whole world."""

    def __init__(self, group) -> None:
        self.group = group
        self.works: list = []

    @staticmethod
    def hook(state: WaitedAllReduce, bucket):
        import torch
        import torch.distributed as dist

        group = state.group if state.group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())
        work = dist.all_reduce(tensor, group=group, async_op=True)
        state.works.append(work)
        if bucket.is_last():
            works, state.works = state.works, []

            def wait_all() -> None:
                for waiting in works:
                    waiting.wait()

            # Callbacks run in the order queued; the reducer queues its finalize_backward after this hook returns.
            torch.autograd.Variable._execution_engine.queue_callback(wait_all)
        return work.get_future().then(lambda fut: fut.value()[0])

"""The interface every backend implements (and the few helpers the native backends share): wrap a model,
forward and backward one micro batch (gradient accumulation the way the backend intends), step, and report the
bytes of parameters, gradients and optimizer state this rank really holds (read from the live tensors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StrategyOptions:
    """What a backend needs to wrap a model; narrow on purpose (no whole benchmark config)."""

    precision: str
    micro_batch: int
    grad_accum: int
    world_size: int
    device: str
    lr: float
    weight_decay: float = 0.0
    gradient_clipping: float = 1.0
    compile: bool = False
    ranks_per_node: int = 0
    """Ranks that count as one node (hpZ's secondary partition, HSDP's mesh); 0: all ranks are one node."""
    zero_overrides: tuple[tuple[str, object], ...] = ()
    """zero_optimization keys over the generator's and the variant's, for every ZeRO strategy (bench
    --zero-override)."""
    sp_gradient_scale: float = 1.0
    """The factor on the gradient of a `_spN` row's loss (lint.installed.ulysses_gradient_scale: what the installed
    DeepSpeed needs at this stage for the mean gradient of the rows)."""
    sequence_parallel: int = 1
    """Ranks that share every row (Ulysses, a `_spN` strategy). Each group of them trains `micro_batch` rows per
    micro step and `grad_accum` counts the group's micro steps: a run keeps the global batch of its sp=1 twin by
    taking sp x as many (the bench's worker sets both)."""


class Strategy:
    """Base of every backend. Call order per optimizer step, for each accumulation micro batch in turn:
    `loss = forward(batch, last)` then `backward(loss, last)`, with last=True for the final micro batch;
    `grad_bytes()` (optional, grads are complete here), then `step()`. A backend whose schedule cannot run forward
    apart from backward (a pipeline) sets `phases_apart = False` and is called `forward_backward(batch, last)`
    instead of the pair; every other backend may be called either way (forward_backward runs the pair).

    The bench times forward, backward and step as separate phases (zero_kit.bench.phases.PhaseClock), so whatever a
    backend does in a call is that call's phase: keep each call to what its name says."""

    name: str = ""
    phases_apart: bool = True
    """Whether forward and backward are separate calls (False: only forward_backward)."""

    def data_split(self) -> tuple[int, int, int]:
        """(data-parallel rank, data-parallel ranks, forward/backward calls per step): which rows of the global batch
        this rank trains on, and in how many pieces. Pure data parallelism: its own rows, one call per micro batch.
        Model-parallel backends override it: the ranks of one replica must see the same rows."""
        import torch.distributed as dist

        return dist.get_rank(), dist.get_world_size(), self.options.grad_accum

    def forward(self, batch: dict[str, Any], last: bool) -> Any:
        """The batch's mean loss as a tensor (what backward takes); `last` is the step's final micro batch."""
        raise NotImplementedError

    def backward(self, loss: Any, last: bool) -> None:
        """Backward of forward's loss (scaled for accumulation as the backend intends); gradients are reduced when
        `last`, as the backend does it."""
        raise NotImplementedError

    def forward_backward(self, batch: dict[str, Any], last: bool) -> float | None:
        """forward then backward in one call: the batch's mean loss, or None on a rank that computes no loss (a
        pipeline's first stage)."""
        loss = self.forward(batch, last)
        self.backward(loss, last)
        return None if loss is None else loss.item()

    def grad_norm(self) -> float | None:
        """The global gradient norm of the step just taken, before clipping, as the backend computed it; None where
        it keeps none."""
        return None

    def step_timers(self) -> dict[str, float]:
        """The backend's own timers of the optimizer step just taken, in ms (DeepSpeed's wall_clock_breakdown);
        empty where the backend keeps none."""
        return {}

    def extra_record(self) -> dict[str, Any]:
        """Backend-specific measurements for the record (a pipeline's bubble), gathered after training."""
        return {}

    def params_held(self) -> int:
        """Parameters (elements) this rank holds of the model: all of them under data parallelism (sharding is a
        byte question, answered by param_and_optimizer_bytes); its tensor-parallel slices or pipeline stage else."""
        return self.n_params

    def step(self) -> None:
        raise NotImplementedError

    def grad_bytes(self) -> int:
        raise NotImplementedError

    def param_and_optimizer_bytes(self) -> tuple[int, int]:
        raise NotImplementedError

    def notes(self) -> str:
        """How the bytes were read (goes into the record)."""
        return ""


def make_optimizer(params, options: StrategyOptions):
    """The same AdamW for every backend, so fp32 losses agree across strategies: torch's fused kernel, the fastest
    correct one on CPU and CUDA alike (on CPU 3x its for-loop default, which DDP would pay per tensor and ZeRO once
    per flat partition), and what the HF Trainer uses by default (adamw_torch_fused)."""
    import torch

    return torch.optim.AdamW(params, **adamw_settings(options.lr, options.weight_decay), fused=True)


def adamw_settings(lr: float, weight_decay: float = StrategyOptions.weight_decay) -> dict[str, Any]:
    """The AdamW every strategy of the bench steps with (make_optimizer), as an optimizer section's params: what a
    user's own config (bench --ds-config) is compared with."""
    return {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": weight_decay}


def clip_and_step(module, optimizer, gradient_clipping: float, *, set_to_none: bool) -> None:
    """The native backends' optimizer step: clip the global grad norm (FSDP2's DTensor grads included), step, zero."""
    import torch

    if gradient_clipping > 0:
        torch.nn.utils.clip_grad_norm_(module.parameters(), gradient_clipping)
    optimizer.step()
    optimizer.zero_grad(set_to_none=set_to_none)


def optimizer_state_tensors(optimizer) -> list:
    return [v for state in optimizer.state.values() for v in state.values() if hasattr(v, "untyped_storage")]

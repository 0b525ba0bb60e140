"""One interface for every backend the benchmark compares: wrap a model, forward + backward one micro
batch (gradient accumulation the way the backend intends), step, and report the bytes of parameters,
gradients and optimizer state this rank really holds (read from the live tensors and partitions).

`build_strategy(name, model, options)` is the only entry point; backends live in ddp.py, fsdp.py and
deepspeed.py and share nothing but this interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# name -> (backend module, ZeRO stage or None, optimizer offload)
STRATEGIES: dict[str, tuple[str, int | None, str]] = {
    "ddp": ("ddp", None, "none"),
    "fsdp": ("fsdp", None, "none"),
    "zero0": ("deepspeed", 0, "none"),
    "zero1": ("deepspeed", 1, "none"),
    "zero2": ("deepspeed", 2, "none"),
    "zero3": ("deepspeed", 3, "none"),
    "zero2_offload": ("deepspeed", 2, "cpu"),
    "zero3_offload": ("deepspeed", 3, "cpu"),
    # Variants that change one DeepSpeed knob to show where its traffic differs from the ZeRO paper:
    # zero{1,2}_reduce: per-owner reduce instead of DeepSpeed's default all-reduce of whole buckets;
    # zero3_release: no reuse distance, live-parameter budget or prefetch, so every parameter is freed after its
    # forward use and re-gathered for backward (the ZeRO paper's 3Ψ traffic).
    "zero1_reduce": ("deepspeed", 1, "none"),
    "zero2_reduce": ("deepspeed", 2, "none"),
    "zero3_release": ("deepspeed", 3, "none"),
}
DS_OVERRIDES: dict[str, dict[str, object]] = {
    "zero1_reduce": {"use_multi_rank_bucket_allreduce": False},
    "zero2_reduce": {"use_multi_rank_bucket_allreduce": False},
    "zero3_release": {
        "stage3_max_reuse_distance": 0,
        "stage3_max_live_parameters": 0,
        "stage3_prefetch_bucket_size": 0,
    },
}
LAUNCHER = {"ddp": "torchrun", "fsdp": "torchrun", "deepspeed": "deepspeed"}


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
    grad_clip: float = 1.0
    compile: bool = False


@dataclass(frozen=True)
class StateBytes:
    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer, "total": self.total}


class Strategy:
    """Base of every backend. Call order per optimizer step: `forward_backward(batch, last=False)` for each
    accumulation micro step, `forward_backward(batch, last=True)` for the final one, `grad_bytes()` (optional,
    grads are complete here), then `step()`."""

    name: str = ""

    def forward_backward(self, batch: dict[str, Any], last: bool) -> float:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def grad_bytes(self) -> int:
        raise NotImplementedError

    def param_and_optimizer_bytes(self) -> tuple[int, int]:
        raise NotImplementedError

    def notes(self) -> str:
        """How the bytes were read (goes into the record)."""
        return ""


def check_name(name: str) -> tuple[str, int | None, str]:
    if name not in STRATEGIES:
        from zero_kit.errors import UserError

        raise UserError(f"unknown strategy {name!r}", f"choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def build_strategy(name: str, model, options: StrategyOptions) -> Strategy:
    """Wrap `model` (identically initialised on every rank) for strategy `name`."""
    backend, stage, offload = check_name(name)
    match backend:
        case "ddp":
            from zero_kit.strategies.ddp import DDPStrategy

            return DDPStrategy(model, options)
        case "fsdp":
            from zero_kit.strategies.fsdp import FSDPStrategy

            return FSDPStrategy(model, options)
        case "deepspeed":
            from zero_kit.strategies.deepspeed import DeepSpeedStrategy

            zero_overrides = DS_OVERRIDES.get(name, {})
            return DeepSpeedStrategy(
                model, options, stage=stage, offload_optimizer=offload, name=name, zero=zero_overrides
            )
        case _:
            raise ValueError(f"unknown backend {backend!r} for strategy {name!r}")


def make_optimizer(params, options: StrategyOptions):
    """The same AdamW for every backend (eager, foreach=False) so fp32 losses agree across strategies."""
    import torch

    return torch.optim.AdamW(
        params, lr=options.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=options.weight_decay, foreach=False
    )


def clip_and_step(module, optimizer, grad_clip: float, *, set_to_none: bool) -> None:
    """The native backends' optimizer step: clip the global grad norm (FSDP2's DTensor grads included), step, zero."""
    import torch

    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=set_to_none)


def optimizer_state_tensors(optimizer) -> list:
    return [v for state in optimizer.state.values() for v in state.values() if hasattr(v, "untyped_storage")]

"""The registry of benchmark strategies: one name -> (backend, ZeRO stage, optimizer offload), the launcher each
backend needs, and `build_strategy(name, model, options)`, the only entry point. Backends live in ddp.py, fsdp.py
and deepspeed.py behind the interface of base.py and share nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zero_kit.errors import UserError

if TYPE_CHECKING:
    from zero_kit.strategies.base import Strategy, StrategyOptions

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


def check_name(name: str) -> tuple[str, int | None, str]:
    if name not in STRATEGIES:
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



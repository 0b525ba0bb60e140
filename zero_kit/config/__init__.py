"""DeepSpeed configs from options: the option dataclasses and the pure builder (no torch, no DeepSpeed, no I/O)."""

from zero_kit.config.builder import RunAdjustments, accelerate_yaml, bucket_sizes, build_ds_config, dumps
from zero_kit.config.spec import Offload, ZeroOptions, ZeroSpec

__all__ = [
    "Offload",
    "RunAdjustments",
    "ZeroOptions",
    "ZeroSpec",
    "accelerate_yaml",
    "bucket_sizes",
    "build_ds_config",
    "dumps",
]

"""DeepSpeed configs from options: the option dataclasses and the pure builder (no torch, no DeepSpeed, no I/O),
which lints what it writes with the linter's rule book (`zero_kit.lint.check_rules`)."""

from zero_kit.config.builder import (
    Generated,
    RunAdjustments,
    accelerate_yaml,
    bucket_sizes,
    build_ds_config,
    dumps,
    generate,
)
from zero_kit.config.spec import Offload, ZeroOptions, ZeroSpec

__all__ = [
    "Generated",
    "Offload",
    "RunAdjustments",
    "ZeroOptions",
    "ZeroSpec",
    "accelerate_yaml",
    "bucket_sizes",
    "build_ds_config",
    "dumps",
    "generate",
]

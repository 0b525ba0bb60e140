"""ZeRO++ (hpZ, qwZ, qgZ) and DeepSpeed's low-precision state options: the keys the generator writes for them.
Pure, like the builder. What cannot work is judged by the linter's rules on the written keys
(zero_kit/lint/rules_zeropp.py, which names the DeepSpeed 0.19 code behind each one) and, for what only the flags
say, by `checks`.
"""

from __future__ import annotations

from typing import Any

from zero_kit.config.spec import ZeroSpec

AUTOCAST_DTYPE = "bfloat16"


def hpz_enabled(spec: ZeroSpec) -> bool:
    return spec.hpz or spec.hpz_partition_size is not None


def hpz_partition_size(spec: ZeroSpec) -> int | None:
    """The hpZ partition size: --hpz-partition-size, else the GPUs per node of a multi-node run; None if unknown."""
    if spec.hpz_partition_size is not None:
        return spec.hpz_partition_size
    if (spec.nodes or 1) > 1 and spec.gpus_per_node is not None:
        return spec.gpus_per_node
    return None


def zeropp_zero_keys(spec: ZeroSpec) -> dict[str, Any]:
    """The zero_optimization keys for hpZ/qwZ/qgZ (none when off)."""
    keys: dict[str, Any] = {}
    if hpz_enabled(spec) and hpz_partition_size(spec) is not None:
        keys["zero_hpz_partition_size"] = hpz_partition_size(spec)
    if spec.quantized_weights:
        keys["zero_quantized_weights"] = True
    if spec.quantized_gradients:
        keys["zero_quantized_gradients"] = True
    return keys


def low_precision_sections(spec: ZeroSpec) -> dict[str, Any]:
    """Additions to the bf16 section and the torch_autocast section (empty when off)."""
    bf16: dict[str, Any] = {}
    if spec.bf16_master_weights:
        bf16["bf16_master_weights_and_grads"] = True
    if spec.bf16_optimizer_states:
        bf16["bf16_optimizer_states"] = True
    sections: dict[str, Any] = {"bf16": bf16} if bf16 else {}
    if spec.torch_autocast:
        sections["torch_autocast"] = {"enabled": True, "dtype": AUTOCAST_DTYPE}
    return sections

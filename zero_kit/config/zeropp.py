"""ZeRO++ (hpZ, qwZ, qgZ) and DeepSpeed's low-precision state options: the keys the generator writes for them.
Pure, like the builder. What cannot work is judged by the linter's rules (zero_kit/lint/rules_zeropp.py, which
names the DeepSpeed 0.19 code behind each one) run on the written keys, and by the flag checks in `checks`.

Where a feature cannot work (the linter's rules, reported by the generator in flag words):
- hpZ, qwZ, qgZ act on ZeRO-3's parameter partitioning only (partition_parameters.py, stage3.py); at stage 0-2
  DeepSpeed ignores them: an error.
- hpZ: DeepSpeed builds the secondary groups from consecutive ranks of min(size, world size) and asserts that this
  divides the world size (utils/groups.py `_create_zero_param_parallel_group`): not dividing is an error. A size
  that does not divide --gpus-per-node puts a secondary shard across nodes, which runs but defeats hpZ's point
  (node-local all-gathers), and a size above the world size is shrunk to it: warnings, in `config` as in `validate`.
- qwZ/qgZ run DeepSpeed's quantizer kernels, a CUDA op build (QuantizerBuilder); on CPU the first step fails with
  "This op had not been implemented on CPU backend". Judged only when the user says the target is CPU
  (--device cpu): writing a GPU cluster's config on a laptop is the ordinary case.
- torch autocast with qwZ: DeepSpeed asserts "Cannot enable both torch autocast and zero quantized weights"
  (runtime/torch_autocast.py).
- bf16_optimizer_states needs bf16_master_weights_and_grads, both need stage >= 1 (runtime/config.py
  `_do_error_check`); bf16 master weights with fp32 optimizer states need optimizer offload with DeepSpeedCPUAdam
  (base_optimizer.py `_configure_master_weights`, stage3/stage_1_and_2 `_enforce_*offload`).
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

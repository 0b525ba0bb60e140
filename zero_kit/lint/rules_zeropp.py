"""ZeRO++ (hpZ, qwZ, qgZ) and the low-precision state options: the rules for configs written by anyone, the
generator included (zero_kit/config/rulebook.py runs them on its output and names the flags).

DeepSpeed's own config parse accepts every case below; they fail (or do nothing) only when deepspeed.initialize
builds the optimizer or the first step runs, so they are caught here.

Where a feature cannot work:
- hpZ, qwZ, qgZ act on ZeRO-3's parameter partitioning only (partition_parameters.py, stage3.py); at stage 0-2
  DeepSpeed ignores them: an error.
- hpZ: DeepSpeed builds the secondary groups from consecutive ranks of min(size, world size) and asserts that this
  divides the world size (utils/groups.py `_create_zero_param_parallel_group`): not dividing is an error. A size
  that does not divide the ranks per node puts a secondary shard across nodes, which runs but defeats hpZ's point
  (node-local all-gathers), and a size above the world size is shrunk to it: warnings, in `config` as in `validate`.
- qwZ/qgZ run DeepSpeed's quantizer kernels, a CUDA op build (QuantizerBuilder); on CPU the first step fails with
  "This op had not been implemented on CPU backend". Judged only when the user says the target is CPU
  (`LintContext.device`, --device cpu): writing a GPU cluster's config on a laptop is the ordinary case.
- torch autocast with qwZ: DeepSpeed asserts "Cannot enable both torch autocast and zero quantized weights"
  (runtime/torch_autocast.py).
- bf16_optimizer_states needs bf16_master_weights_and_grads, both need stage >= 1 (runtime/config.py
  `_do_error_check`); bf16 master weights with fp32 optimizer states need optimizer offload with DeepSpeedCPUAdam
  (base_optimizer.py `_configure_master_weights`, stage3/stage_1_and_2 `_enforce_*offload`).
"""

from __future__ import annotations

from zero_kit.lint.problem import LintContext, Problem, lookup

QUANTIZED_KEYS = ("zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients")


def zeropp_rules(config: dict, context: LintContext) -> list[Problem]:
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    stage = zero.get("stage", 0)
    stage = stage if isinstance(stage, int) and not isinstance(stage, bool) else None
    hpz = zero.get("zero_hpz_partition_size")
    hpz = hpz if isinstance(hpz, int) and not isinstance(hpz, bool) and hpz > 1 else None
    quantized = [key for key in QUANTIZED_KEYS if zero.get(key) is True]
    problems = []
    if stage is not None and stage < 3:
        for key in (["zero_hpz_partition_size"] if hpz else []) + quantized:
            problems.append(
                Problem(
                    "error",
                    f"zero_optimization.{key}",
                    zero[key],
                    f"ZeRO++ works on ZeRO-3's parameter partitioning; at stage {stage} DeepSpeed ignores it",
                    "set zero_optimization.stage to 3, or remove the key",
                )
            )
    if hpz and stage == 3:
        problems += _hpz_rules(hpz, context)
    if context.device == "cpu":
        problems += [_needs_cuda(key) for key in quantized]
    if zero.get("zero_quantized_weights") is True and lookup(config, "torch_autocast.enabled") is True:
        problems.append(
            Problem(
                "error",
                "torch_autocast.enabled",
                True,
                "torch autocast with zero_quantized_weights: deepspeed.initialize asserts 'Cannot enable both torch"
                " autocast and zero quantized weights'",
                "disable torch_autocast or zero_optimization.zero_quantized_weights",
            )
        )
    return problems + _low_precision_rules(config, stage)


def _needs_cuda(key: str) -> Problem:
    return Problem(
        "error",
        f"zero_optimization.{key}",
        True,
        "needs CUDA: DeepSpeed's quantizer kernels are a CUDA op build; on this CPU run the first step fails with"
        " 'This op had not been implemented on CPU backend'",
        "remove it (or set it to false) for a CPU run; keep it for the GPU cluster",
    )


def _hpz_rules(size: int, context: LintContext) -> list[Problem]:
    path = "zero_optimization.zero_hpz_partition_size"
    world, per_node = context.world_size, context.ranks_per_node
    if world is not None and size > world:
        return [
            Problem(
                "warning",
                path,
                size,
                f"larger than the world size {world} ({context.world_size_source}): DeepSpeed shrinks it to {world},"
                " so the secondary shard is the whole job and hpZ saves nothing",
                "set it to the GPUs per node of a multi-node run",
            )
        ]
    if world is not None and world % size:
        return [
            Problem(
                "error",
                path,
                size,
                f"does not divide the world size {world} ({context.world_size_source}): deepspeed.initialize asserts"
                " it (secondary groups are consecutive ranks)",
                f"use a divisor of {world}, normally the GPUs per node",
            )
        ]
    if per_node is not None and per_node % size:
        return [
            Problem(
                "warning",
                path,
                size,
                f"does not divide the {per_node} ranks per node: some secondary shards span two nodes, and hpZ exists"
                " to keep parameter all-gathers inside a node",
                f"use {per_node} (or a divisor of it)",
            )
        ]
    return []


def _low_precision_rules(config: dict, stage: int | None) -> list[Problem]:
    key = "bf16" if "bf16" in config or "bfloat16" not in config else "bfloat16"
    section = config.get(key)
    if not isinstance(section, dict):
        return []
    master = section.get("bf16_master_weights_and_grads") is True
    states = section.get("bf16_optimizer_states") is True
    offload = lookup(config, "zero_optimization.offload_optimizer.device") in ("cpu", "nvme")
    problems = []
    if states and not master:
        problems.append(
            Problem(
                "error",
                f"{key}.bf16_optimizer_states",
                True,
                "bf16_optimizer_states needs bf16_master_weights_and_grads (DeepSpeed asserts it)",
                f'add "bf16_master_weights_and_grads": true under {key}',
            )
        )
    for name, on in (("bf16_master_weights_and_grads", master), ("bf16_optimizer_states", states)):
        if on and stage is not None and stage == 0:
            problems.append(
                Problem(
                    "error",
                    f"{key}.{name}",
                    True,
                    "needs ZeRO stage 1, 2 or 3 (DeepSpeed asserts it)",
                    "set zero_optimization.stage to 1, 2 or 3, or remove it",
                )
            )
    if master and not states and not offload and stage in (1, 2, 3):
        problems.append(
            Problem(
                "error",
                f"{key}.bf16_master_weights_and_grads",
                True,
                "bf16 master weights with fp32 optimizer states: deepspeed.initialize asserts 'Master weights feature"
                " requires ZeRO Offload with DeepSpeedCPUAdam'",
                f'add "bf16_optimizer_states": true under {key}, or offload_optimizer {{"device": "cpu"}}',
            )
        )
    return problems

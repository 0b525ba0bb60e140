"""The Ulysses sequence-parallelism rules (DeepSpeed's ALST, `sequence_parallel_size` > 1; accelerate and the HF
Trainer run it through `ParallelismConfig(sp_backend="deepspeed", sp_size=N)`), each from DeepSpeed's or accelerate's
own code and reproduced against it in tests/unit/test_lint_sp.py:

- E attention heads not divisible by sp; E key-value heads that neither divide sp nor are divisible by it. DeepSpeed
  0.19.8 `UlyssesSPAttentionHF.__init__` (runtime/sequence_parallel/ulysses_sp.py) raises ValueError on both; fewer
  kv heads than sp that divide it are replicated (`kv_replication_factor = sp // kv`), no error. Needs the model's
  heads (LintContext, from `--model`).
- W sp not dividing the ranks per node: `parallel_state_sp.initialize_sequence_parallel` groups consecutive ranks,
  so some groups span two nodes and their all-to-alls (in every attention layer) cross the inter-node link.
- E AutoEP (`expert_parallel.enabled`) at ZeRO stage 3: `DeepSpeedEngine._validate_zero3_moe_compatibility` asserts
  "AutoEP with ZeRO Stage 3 does not support sequence parallelism yet" for a model with MoE layers. DeepSpeed's SP
  refuses no other stage or offload: runtime/zero and the engine hold no such check (ZeRO-0 to 3 each scale the
  gradients by sp), so there is no rule for them.
- W ZeRO stage 0-2 on DeepSpeed 0.19.6 and later (lint.installed.ulysses_gradient_scale): the gradients of the HF
  Trainer's SP loss come back sp x too large (grad_norm sp x, clipping at 1/sp of its threshold), measured against
  the same run at sp=1 by tests/dist/test_bench_compare.py; zero-kit train and bench correct it.
- The world size not divisible by sp is rules_batch's (it divides the world by sp for the batch keys).
- In an accelerate YAML's `parallelism_config` (`accelerate_sp_rules`, from lint/accelerate_yaml.py), where the
  sequence length and the attention are known: E a sequence length not divisible by sp
  (`UlyssesSPDataLoaderAdapter.refill` raises ValueError on every such batch; `register_with_transformers` splits a
  fixed length by floor division); E an attention implementation accelerate's `DeepSpeedSequenceParallelConfig`
  refuses (eager, flex_attention, anything but SDPA or flash attention), asked of that class itself. DeepSpeed's
  `register_with_transformers` refuses eager too: it needs a 4D attention mask, which Ulysses drops.
"""

from __future__ import annotations

from typing import Any

from zero_kit.lint.problem import LintContext, Problem, join, lookup

PATH = "sequence_parallel_size"
SECTION = "parallelism_config"
YAML_PREFIX = "parallelism_config_"
"""accelerate's YAML keys under parallelism_config are its launch options' names (`--parallelism_config_sp_size`)."""


def sequence_parallel_size(config: dict) -> int:
    """sequence_parallel_size as DeepSpeedConfig reads it (1 when absent or not a positive whole number; a bad type is
    the schema's problem)."""
    value = config.get(PATH)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def sp_rules(config: dict, context: LintContext) -> list[Problem]:
    sp = sequence_parallel_size(config)
    if sp < 2:
        return []
    return _heads(context, sp) + _nodes(context, sp) + _autoep(config, sp) + _scaled_gradients(config, sp)


def _heads(context: LintContext, sp: int) -> list[Problem]:
    heads = context.attention_heads
    if heads is None:
        return []
    kv = context.kv_heads or heads
    problems, fitting = [], _fitting(heads, kv, sp, context.world_size)
    fix = f"set {PATH} to {fitting}, or leave it out" if fitting > 1 else f"leave {PATH} out (no size fits the heads)"
    if heads % sp:
        message = (
            f"the model's attention heads({heads}) are not divisible by {PATH}({sp}): Ulysses gives each rank of a"
            " group heads / sp whole heads, and DeepSpeed's UlyssesSPAttentionHF raises ValueError at start-up"
        )
        problems.append(Problem("error", PATH, sp, message, fix))
    if kv % sp and sp % kv:
        message = (
            f"the model's key-value heads({kv}) neither divide {PATH}({sp}) nor are divisible by it: DeepSpeed's"
            " UlyssesSPAttentionHF raises ValueError at start-up (fewer kv heads that divide sp are replicated)"
        )
        problems.append(Problem("error", PATH, sp, message, fix))
    return problems


def heads_split(heads: int, kv: int, sp: int) -> bool:
    """Ulysses can split these heads over `sp` ranks: the attention heads divide evenly and the key-value heads either
    divide evenly or divide `sp` (then they are replicated)."""
    return heads % sp == 0 and (kv % sp == 0 or sp % kv == 0)


def sp_sizes(heads: int, kv: int, seq_len: int, ranks_per_node: int, above: int = 1) -> list[int]:
    """The --sp sizes above `above` that one node's ranks can run on this sequence: a divisor of the node's ranks (a
    group stays in one node) and of the sequence, with heads Ulysses can split."""
    return [sp for sp in range(above + 1, ranks_per_node + 1)
            if ranks_per_node % sp == 0 and seq_len % sp == 0 and heads_split(heads, kv, sp)]  # fmt: skip


def _fitting(heads: int, kv: int, sp: int, world: int | None) -> int:
    """The largest size up to `sp` that Ulysses accepts for these heads and that divides the world size (where known);
    1: none but no sequence parallelism."""
    return max(d for d in range(1, sp + 1)
               if heads_split(heads, kv, d) and (world is None or world % d == 0))  # fmt: skip


def _nodes(context: LintContext, sp: int) -> list[Problem]:
    per_node, world = context.ranks_per_node, context.world_size
    if per_node is None or not per_node % sp or (world is not None and world <= per_node):
        return []
    nearest = max(d for d in range(1, min(per_node, sp) + 1) if per_node % d == 0)
    message = (
        f"{PATH}({sp}) does not divide the {per_node} ranks per node: DeepSpeed makes each group of consecutive"
        " ranks, so some groups span two nodes and their all-to-alls, in every attention layer, cross the slower"
        " inter-node link"
    )
    fix = (
        f"set {PATH} to {nearest} (a divisor of {per_node})" if nearest > 1 else f"use a {PATH} that divides {per_node}"
    )
    return [Problem("warning", PATH, sp, message, fix)]


def _autoep(config: dict, sp: int) -> list[Problem]:
    if lookup(config, "expert_parallel.enabled") is not True or lookup(config, "zero_optimization.stage") != 3:
        return []
    message = (
        f"AutoEP (expert_parallel.enabled) at ZeRO stage 3 with {PATH}({sp}): deepspeed.initialize asserts 'AutoEP"
        " with ZeRO Stage 3 does not support sequence parallelism yet' for a model with MoE layers"
    )
    fix = f"set zero_optimization.stage to 2 (or 1), or leave {PATH} out"
    return [Problem("error", PATH, sp, message, fix)]


def _scaled_gradients(config: dict, sp: int) -> list[Problem]:
    from zero_kit.lint.installed import SP_GRADIENTS_SCALED_FROM, deepspeed_version, ulysses_gradient_scale

    stage = lookup(config, "zero_optimization.stage")
    stage = stage if isinstance(stage, int) and not isinstance(stage, bool) else 0
    if ulysses_gradient_scale(stage, sp) == 1.0:
        return []
    message = (
        f"DeepSpeed {deepspeed_version()} (>= {SP_GRADIENTS_SCALED_FROM}) at ZeRO stage {stage} with {PATH}({sp})"
        f" hands back {sp} x the gradients of the HF Trainer's sequence-parallel loss: grad_norm is logged {sp} x too"
        f" large and gradient clipping cuts at 1/{sp} of its threshold (ZeRO-3 is exact; zero-kit train corrects it)"
    )
    fix = (
        f"set zero_optimization.stage to 3, or give gradient_clipping (max_grad_norm) {sp} x the threshold you mean"
        f" (the logged grad_norm stays {sp} x)"
    )
    return [Problem("warning", PATH, sp, message, fix)]


def accelerate_sp_rules(section: dict[str, Any]) -> list[Problem]:
    """The Ulysses settings of an accelerate YAML's `parallelism_config` section, as `accelerate launch` hands them to
    the ranks: a sequence length sp does not divide, an attention implementation accelerate refuses."""
    sp = section.get(YAML_PREFIX + "sp_size")
    if not isinstance(sp, int) or isinstance(sp, bool) or sp < 2:
        return []
    problems = []
    length_key = YAML_PREFIX + "sp_seq_length"
    length = _whole_number(section.get(length_key))
    if length is not None and length % sp:
        message = (
            f"sequence length {length} is not divisible by sp_size({sp}): DeepSpeed's UlyssesSPDataLoaderAdapter"
            f" raises ValueError on every batch of that length (\"batch's seqlen={length} isn't divisible by"
            f' sp-size={sp}")'
        )
        fix = f"pad the rows to a multiple of {sp} (e.g. {length + sp - length % sp}) and say that length here"
        problems.append(Problem("error", join(SECTION, length_key), section[length_key], message, fix))
    attention_key = YAML_PREFIX + "sp_attn_implementation"
    if attention_key in section:
        problems += attention_problems(section[attention_key], join(SECTION, attention_key))
    return problems


def _whole_number(value: Any) -> int | None:
    """A sequence length as accelerate reads it (a number, or digits: its launch option is a string)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.strip().isdigit() else None


def attention_problems(value: Any, path: str) -> list[Problem]:
    """An attention implementation for Ulysses, judged by accelerate's own DeepSpeedSequenceParallelConfig (the class
    every rank builds from the launcher's PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION, `str(value)`)."""
    try:
        from accelerate.utils import DeepSpeedSequenceParallelConfig
    except ImportError:  # accelerate before its sequence parallelism (the oldest supported set: 1.11)
        import importlib.metadata as metadata

        message = (
            f"accelerate {metadata.version('accelerate')} has no sequence parallelism (DeepSpeedSequenceParallelConfig)"
        )
        return [Problem("error", path, value, message, "install a newer accelerate (constraints/newest.txt)")]
    try:
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True, sp_attn_implementation=str(value))
    except ValueError as err:
        message = f"accelerate refuses it for sequence parallelism when each rank starts ({err})"
        fix = "use sdpa (CPU or GPU) or flash_attention_2 (GPU), the model's own attn_implementation"
        return [Problem("error", path, value, message, fix)]
    return []

"""The AutoTP training rules (the `tensor_parallel` section, `autotp_size` > 1), each from DeepSpeed's own code and
reproduced in tests/unit/test_lint_autotp.py (and, for the world size, tests/dist/test_autotp_world.py):

- E ZeRO stage 3 where the installed engine asserts stage <= 2 (0.18.3 `_configure_tensor_parallel_states`; 0.19.8
  supports AutoTP with stage 3 and this rule is silent there): `installed.autotp_refuses_zero3`.
- E autotp_size not dividing the world size: `groups._init_tp_mesh_device` builds a (world // tp, tp) mesh, so the
  world % tp ranks left out fail at start-up (IndexError) while the others wait for them.
- E tensor_parallel.tp.tp_size other than 1 or autotp_size (0.19.8 `_apply_autotp_partitioning` ValueError).
- W autotp_size above the model's key-value heads (the engine's own warning: ranks beyond the head count hold no
  attention shard), or not dividing them (`tp_shard.get_shard_size` splits q/k/v by whole kv heads, so some ranks
  get one head more: attention runs at the speed of the fullest rank). Needs the model's heads (LintContext).
- W the batch: DeepSpeedConfig checks train_batch_size = micro x accum x ALL ranks (no mpu: `dist.get_world_size()`),
  while the tp ranks of a group train on the same samples: a step sees train_batch_size / tp distinct samples.
- W an installed DeepSpeed that does not shard from the config (0.18.3: the engine builds the TP groups only; the
  script must call `deepspeed.tp_model_init` first, or every rank trains the whole model).
"""

from __future__ import annotations

from zero_kit.lint.problem import LintContext, Problem, lookup

PATH = "tensor_parallel.autotp_size"


def autotp_size(config: dict) -> int:
    """autotp_size as DeepSpeed reads it (0 or 1: no AutoTP; a bad type is the schema's problem)."""
    value = lookup(config, PATH)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def tp_rules(config: dict, context: LintContext) -> list[Problem]:
    tp = autotp_size(config)
    if tp < 2:
        return []
    # the installed DeepSpeed is read only for an AutoTP config: `zero-kit config` without --tp never imports it
    from zero_kit.lint.installed import autotp_shards_from_config, deepspeed_version

    problems = _stage_and_size(config, context, tp)
    problems += _heads(context, tp)
    if not autotp_shards_from_config():
        message = (
            f"DeepSpeed {deepspeed_version()} builds the tensor-parallel groups from autotp_size but does not shard the"
            " model: unless the script calls deepspeed.tp_model_init first, every rank trains the whole model"
        )
        fix = f"call model = deepspeed.tp_model_init(model, tp_size={tp}, dtype=...) before deepspeed.initialize"
        problems.append(Problem("warning", PATH, tp, message, fix))
    return problems


def _stage_and_size(config: dict, context: LintContext, tp: int) -> list[Problem]:
    from zero_kit.lint.installed import autotp_refuses_zero3, autotp_shards_from_config, deepspeed_version

    problems = []
    if lookup(config, "zero_optimization.stage") == 3 and autotp_refuses_zero3():
        message = (
            f"DeepSpeed {deepspeed_version()} refuses AutoTP with ZeRO stage 3 (the engine asserts stage <= 2 when"
            " tensor parallelism starts)"
        )
        fix = "set zero_optimization.stage to 2 (or 1), or leave autotp_size out"
        problems.append(Problem("error", PATH, tp, message, fix))
    tp_size = lookup(config, "tensor_parallel.tp.tp_size")
    if isinstance(tp_size, int) and tp_size not in (1, tp) and autotp_shards_from_config():
        message = f"tensor_parallel.tp.tp_size ({tp_size}) does not match autotp_size ({tp}): DeepSpeed raises"
        problems.append(Problem("error", "tensor_parallel.tp.tp_size", tp_size, message, "remove tp.tp_size"))
    world = context.world_size
    if world is not None and world % tp:
        message = (
            f"autotp_size({tp}) does not divide the world size({world}, {context.world_size_source}): DeepSpeed"
            f" builds a {world // tp} x {tp} mesh and the {world % tp} rank(s) outside it fail at start-up"
        )
        fix = f"set autotp_size to {_divisor(world, tp)} (it must divide {world}), or run on a multiple of {tp} ranks"
        problems.append(Problem("error", PATH, tp, message, fix))
    elif world is not None and world > tp:
        problems.append(_batch_warning(config, world, tp))
    return problems


def _batch_warning(config: dict, world: int, tp: int) -> Problem:
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps", 1)
    numbers = isinstance(micro, int) and isinstance(accum, int)
    samples = f" = {micro * accum * world // tp}" if numbers else ""
    message = (
        f"DeepSpeed checks train_batch_size against all {world} ranks, but the {tp} ranks of a tensor-parallel group"
        f" train on the same samples: each step sees micro x grad_accum x {world // tp} data-parallel ranks{samples}"
        " distinct samples, train_batch_size / autotp_size"
    )
    fix = "size the learning rate and the data for that many samples per step (train_batch_size stays as it is)"
    return Problem("warning", PATH, tp, message, fix)


def _heads(context: LintContext, tp: int) -> list[Problem]:
    kv = context.kv_heads or context.attention_heads
    if kv is None:
        return []
    if tp > kv:
        message = (
            f"autotp_size({tp}) exceeds the model's key-value heads({kv}): ranks beyond the head count hold no"
            " attention shard and attention does not scale past that point (DeepSpeed's own warning)"
        )
        return [Problem("warning", PATH, tp, message, f"set autotp_size to {_divisor(kv, tp)}")]
    if kv % tp:
        message = (
            f"autotp_size({tp}) does not divide the model's key-value heads({kv}): DeepSpeed splits attention by whole"
            f" heads, so some ranks get {kv // tp + 1} heads and others {kv // tp}; the step waits for the fullest"
        )
        return [Problem("warning", PATH, tp, message, f"set autotp_size to {_divisor(kv, tp)}")]
    return []


def _divisor(total: int, below: int) -> int:
    """The largest divisor of `total` not above `below`: the nearest size that divides evenly."""
    return max(d for d in range(1, min(total, below) + 1) if total % d == 0)

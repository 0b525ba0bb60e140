"""Lint a DeepSpeed config before a GPU hour is spent on it.

`lint(config, context)` is pure: no printing, no exit, no environment reads. It checks the config
against DeepSpeed's own schema (pydantic models and the keys its parser reads, see `ds_schema`, checked in `lint_schema`),
adds the rules DeepSpeed does not enforce (misspelt keys, numbers written as strings, "auto" where
nobody fills it, batch arithmetic at the real world size, contradictory offload/precision), and
finally runs DeepSpeed's own parse so that whatever passes here also passes there.

Rules (E: error, W: warning):
- E unknown key inside a section DeepSpeed validates (pydantic models, optimizer/scheduler params checked
  against the signature of the class DeepSpeed builds), with "did you mean"; E misspelling (<= 2 edits or case)
  of a real key where DeepSpeed silently ignores it (top level, activation_checkpointing, aio, ...); W other
  ignored keys (e.g. LLaMA-Factory's comms_config); "_comment"-style keys are left alone.
- E a zero_optimization key (any field or alias of DeepSpeedZeroConfig: offload_optimizer, stage3_*, ...) at the
  top level, where DeepSpeed silently ignores it: "move it under zero_optimization".
- E wrong JSON type, incl. numbers/booleans written as strings ("8", "true") that pydantic would coerce; top-level
  keys DeepSpeed reads with a None default get their type from its *_FORMAT examples or from its arithmetic on
  them (e.g. steps_per_print "10": the parse keeps the string, the first step raises TypeError).
- E keys of removed DeepSpeed features (DeepSpeed's own message, naming the installed version: valid only on older
  releases); E 1-bit optimizer types (OneBitAdam, ...: gone in 0.19, initialize fails); W deprecated keys.
- E "auto" with --for deepspeed (except where DeepSpeed's own default is "auto"); with hf-trainer/accelerate
  E "auto" where the HF Trainer does not fill it (list read off transformers), W instead where DeepSpeed drops
  it and uses its default (top level of a model section, e.g. zero_optimization.prefetch_bucket_size); W accelerate
  with train_batch_size "auto" at world size != 1 (fails only on a CPU-only host, where accelerate has no backend
  and counts 1 process); W HF Trainer with hard-coded batch keys (must equal its TrainingArguments); W ZeRO-3 with a
  train_batch_size key for the HF Trainer (any value) or accelerate (a number) at world size != 1 (zero.Init parses
  the config before DeepSpeed's communication is up on CPU ranks and counts one rank);
  E accelerate without zero_optimization.
- E batch triple: non-positive / non-integer values, none given, train_batch_size != micro x accum x world
  (world from --world-size or the launcher env, divided by sequence_parallel_size), or not divisible when one
  key is derived; W accelerate with unknown world size.
- E fp16 and bf16 both enabled; E offload_param below stage 3; E offload_optimizer at stage 0; E NVMe optimizer
  offload below stage 3; E NVMe offload without nvme_path; W stage3_* keys below stage 3; W stage 3 for the
  HF Trainer/accelerate without stage3_gather_16bit_weights_on_model_save (saved weights would be empty).
- Each consumer's contract (rules_consumer; what the script does from `validate --client-optimizer` or `--script`):
  E an optimizer/scheduler section beside an own accelerate loop's; W a section beside deepspeed.initialize's own
  (ignored); E no optimizer anywhere under deepspeed.initialize; W/E optimizer offload + the script's own torch
  optimizer under plain deepspeed (ZeRORuntimeException unless DeepSpeedCPUAdam); W/E an own accelerate loop on a
  CPU run without a process-group backend (every rank a world of one).
- ZeRO++ and low-precision states (DeepSpeed's parse accepts these; initialize or the first step fails): E hpZ
  (zero_hpz_partition_size > 1), qwZ/qgZ (zero_quantized_*) below stage 3 (ignored there); E hpZ size not dividing
  the world size; W hpZ size above the world size (shrunk to it) or not dividing the ranks per node (shards span
  nodes); E qwZ/qgZ on a CPU run (--device cpu; CUDA-only quantizer); E torch_autocast with zero_quantized_weights;
  E bf16_optimizer_states without bf16_master_weights_and_grads, either at stage 0; E bf16 master weights with fp32
  optimizer states and no optimizer offload (needs DeepSpeedCPUAdam).
- E optimizer/scheduler type DeepSpeed cannot build; W section without type; max_grad_norm in optimizer params:
  E for hf-trainer/accelerate (DeepSpeed builds that optimizer), W for plain deepspeed (only if the script passes none);
  E warmup_num_steps <= 0; E total_num_steps < warmup_num_steps; E data_types.*_dtype not a DeepSpeed dtype.
- With the arguments of the user's own Trainer script (`context.trainer_args`, rules_trainer): E every fixed value the
  HF Trainer compares with its TrainingArguments and stops on (batch keys, clipping, optimizer params, fp16/bf16,
  scheduler lr and steps), W such a value that depends on what is unknown here (world size, dataset length); on a
  CPU run E no use_cpu, E ZeRO-3 with train_batch_size, E/W TrainingArguments' own refusal; E ACCELERATE_USE_CPU set.
- AutoTP (tensor_parallel.autotp_size > 1, rules_tp): E stage 3 where the installed DeepSpeed refuses it (0.18.3);
  E autotp_size not dividing the world size; E tp.tp_size disagreeing; W more than or not dividing the model's kv
  heads (with a model); W the batch counts tp ranks (train_batch_size / tp distinct samples); W a DeepSpeed that
  does not shard from the config (needs deepspeed.tp_model_init).
- Ulysses sequence parallelism (sequence_parallel_size > 1, rules_ulysses): E attention heads not divisible by it,
  E key-value heads that neither divide it nor are divisible by it (with a model); W not dividing the ranks per node
  (groups span nodes); E AutoEP at ZeRO-3. In an accelerate YAML (accelerate_yaml): E a sequence length it does not
  divide, E an attention implementation accelerate refuses for it (eager, flex_attention, ...).
- E NaN/Infinity anywhere; E duplicate keys (reader); W not strict JSON but hjson reads it (reader, --for deepspeed
  only; the other consumers cannot read it); E DeepSpeed's own DeepSpeedConfig parse fails at the world size.
"""

from __future__ import annotations

from typing import Any

from zero_kit.lint import rules as lint_rules
from zero_kit.lint import (
    rules_batch,
    rules_consumer,
    rules_tp,
    rules_ulysses,
    rules_zero,
    rules_zeropp,
)
from zero_kit.lint.problem import ROOT, LintContext, Problem


def lint(config: Any, context: LintContext | None = None) -> list[Problem]:
    """Every problem in `config` (a parsed DeepSpeed JSON), errors and warnings, in one list."""
    # DeepSpeed's schema and parse are imported here: the rule pass alone (check_rules, run by `zero-kit config` on
    # every config it writes) never reads the installed DeepSpeed, so that quick command does not import them
    from zero_kit.lint import ds_parse
    from zero_kit.lint import schema as lint_schema

    context = context or LintContext()
    if not isinstance(config, dict):
        kind = type(config).__name__
        return [
            Problem(
                "error",
                ROOT,
                config,
                f"a DeepSpeed config is a JSON object, not a {kind}",
                "wrap the settings in {...}",
            )
        ]
    problems, autos, dropped = lint_schema.check_schema(config, context.target)
    problems += lint_rules.auto_rules(autos, dropped, context.target)
    rule_problems, world_size = _rule_pass(config, context)
    problems += rule_problems
    problems += lint_rules.dtype_rules(config)
    problems = _dedupe(problems)
    if not any(p.severity == "error" for p in problems):
        problems += ds_parse.check_with_deepspeed(config, world_size, autos)
    return problems


def check_rules(config: dict, context: LintContext | None = None) -> list[Problem]:
    """The rule book alone: the rules about values and their combinations (batch arithmetic, precision, offload and
    stage, ZeRO++, low-precision states, scheduler), without DeepSpeed's schema or its own parse. Needs neither
    torch nor deepspeed (milliseconds), so the generator runs it on every config it writes; `lint` runs the same
    rules, so the generator and `zero-kit validate` cannot disagree on them."""
    return _dedupe(_rule_pass(config, context or LintContext())[0])


def _rule_pass(config: dict, context: LintContext) -> tuple[list[Problem], int]:
    """The rules (in `lint`'s order) and the world size to give DeepSpeed's own parse."""
    problems = lint_rules.non_finite(config, "")
    batch_problems, world_size = rules_batch.batch_rules(config, context)
    problems += batch_problems
    problems += rules_batch.integration_batch_rules(config, context)
    problems += lint_rules.precision_rules(config)
    problems += rules_zero.zero_rules(config, context.target, context.device)
    problems += rules_zeropp.zeropp_rules(config, context)
    problems += rules_tp.tp_rules(config, context)
    problems += rules_ulysses.sp_rules(config, context)
    problems += lint_rules.scheduler_rules(config)
    if context.trainer_args is not None:  # a user's own Trainer script's arguments (validate --script, or after --)
        from zero_kit.lint import rules_trainer

        problems += rules_trainer.trainer_rules(config, context)
    problems += rules_consumer.consumer_rules(config, context)
    return problems, world_size


def _dedupe(problems: list[Problem]) -> list[Problem]:
    """One problem per (path, message); the first rule to speak about a path wins over DeepSpeed's echo."""
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.path, p.message) not in seen:
            seen.add((p.path, p.message))
            out.append(p)
    return out

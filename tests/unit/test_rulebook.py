"""One rule book: `zero-kit config` refuses exactly what `zero-kit validate` calls an error, and warns where it warns.

Walked over the rule book's own table (zero_kit/config/rulebook.py KEY_FIELDS: key path -> the option whose flag
writes it): every option in it takes each of its values (Literal choices and booleans from ZeroSpec's types, the
numbers from NUMBERS below), at every stage and world shape, alone and in a seeded random sample of combinations.
For each case the generator's answer (refused, or written with warnings) is compared with the full linter's answer
(`zero_kit.lint.lint`, schema and DeepSpeed's own parse included) about the keys those flags map to. A new rule
in lint/ about a key the table knows, or a new table entry, is walked without touching this file.

A refusal that is no DeepSpeed rule (a flag check in config/checks.py: number ranges, --nvme-path without nvme, a
--hpz size the flags cannot give, bf16 state flags or autocast with another precision) is only checked to refuse.
"""

from __future__ import annotations

import dataclasses
import random
import re
import typing

import pytest

from zero_kit.config.builder import RunAdjustments, generate, map_options
from zero_kit.config.checks import flag_problems, number_problems
from zero_kit.config.rulebook import KEY_FIELDS, flag, flag_with_value, lint_context
from zero_kit.config.spec import ZeroSpec
from zero_kit.errors import UserError
from zero_kit.lint import LintContext, lint

# Values for the options whose type does not list them (Literal and bool fields need nothing here).
NUMBERS: dict[str, tuple[object, ...]] = {
    "nvme_path": (None, "/local_nvme"),
    "hpz_partition_size": (None, 2, 3, 4, 8, 16),
    "hidden_size": (None, 64),
    "leaf_module": (None, "LlamaDecoderLayer"),
    "micro_batch": (None, 1, 3),
    "grad_accum": (None, 2),
    "global_batch": (None, 16, 24, 64),
    "gradient_clipping": (1.0, 0.0),
    "lr": (2e-5, 0.1),
    "weight_decay": (0.0, 0.01),
    "tp": (1, 2, 3, 4),
    "precision": (None, "bf16", "fp16", "fp32"),  # None: the default, bf16 or (with --device cpu) fp32
}
# World shapes the flags can give (none of them contradict each other: that is a flag check).
WORLDS = (
    {},
    {"world_size": 2},
    {"world_size": 8},
    {"nodes": 2, "gpus_per_node": 4},
    {"nodes": 1, "gpus_per_node": 8},
)
# Options outside the table that change what the linter is told (the target, the device).
CONTEXT_FIELDS = ("hf_auto", "device")
HINTS = typing.get_type_hints(ZeroSpec)
SAMPLES = 3000


def _values(field: str) -> tuple[object, ...]:
    kind = HINTS[field]
    if kind is bool:
        return (False, True)
    if typing.get_origin(kind) is typing.Literal:
        return typing.get_args(kind)
    assert field in NUMBERS, f"give NUMBERS values for {field} (a new KEY_FIELDS entry)"
    return NUMBERS[field]


FIELDS = sorted(set(KEY_FIELDS.values()) | set(CONTEXT_FIELDS))
DOMAIN = {field: _values(field) for field in FIELDS}


def _one_at_a_time() -> list[ZeroSpec]:
    cases = []
    for world in WORLDS:
        for stage in (0, 1, 2, 3):
            for field in FIELDS:
                for value in DOMAIN[field]:
                    cases.append(ZeroSpec(**{**world, "stage": stage, field: value}))
    return cases


def _sampled(count: int, seed: int = 21) -> list[ZeroSpec]:
    """Random combinations; each option keeps its default half the time, so that accepted configs (and their
    warnings) are walked as well as refused ones."""
    rng = random.Random(seed)
    defaults = ZeroSpec()

    def pick(field: str) -> object:
        return getattr(defaults, field) if rng.random() < 0.5 else rng.choice(DOMAIN[field])

    return [ZeroSpec(**rng.choice(WORLDS), **{field: pick(field) for field in FIELDS}) for _ in range(count)]


def _world(spec: ZeroSpec) -> int | None:
    if spec.world_size is not None:
        return spec.world_size
    return None if spec.nodes is None else spec.nodes * (spec.gpus_per_node or 1)


def _refused_count(err: UserError) -> int:
    """How many problems a refusal lists (`raise_all` writes "N problems in the config options:")."""
    many = re.match(r"(\d+) problems in the config options:", err.message)
    return int(many.group(1)) if many else 1


def _generator(spec: ZeroSpec) -> tuple[UserError | None, tuple[str, ...]]:
    try:
        return None, generate(spec).warnings
    except UserError as err:
        return err, ()


def _batch_keys_of_the_flags(spec: ZeroSpec) -> dict[str, int]:
    """The batch keys exactly as the batch flags give them (what a user writing the JSON by hand would write)."""
    given = {
        "train_batch_size": spec.global_batch,
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
    }
    return {key: value for key, value in given.items() if value is not None}


def _check_agreement(spec: ZeroSpec) -> None:
    refused, warnings = _generator(spec)
    if number_problems(spec) or flag_problems(spec):
        assert refused is not None, f"a flag check passed silently: {spec}"
        return
    world = _world(spec)
    context = lint_context(spec, world)
    try:
        config = map_options(spec, RunAdjustments())
    except UserError as err:
        # The batch flags cannot be derived into keys: the same numbers written as JSON are a linter error too,
        # except --global-batch with no world size, which only the flags can get wrong (nothing to split it by).
        assert refused is not None and str(err) in str(refused)
        if world is not None:
            problems = lint(_batch_keys_of_the_flags(spec), dataclasses.replace(context, target="deepspeed"))
            assert any(p.severity == "error" for p in problems), (spec, str(err))
        return
    problems = lint(config, context)
    errors = [p for p in problems if p.severity == "error"]
    lint_warnings = [p for p in problems if p.severity == "warning"]
    assert (refused is not None) == bool(errors), f"config {'refuses' if refused else 'writes'} {spec}: {errors}"
    for said in [str(refused)] if refused is not None else list(warnings):
        # (the HF Trainer's TrainingArguments has a gradient_accumulation_steps of its own: no key of ours)
        left = [p for p in KEY_FIELDS if re.search(rf"(?<![\w.])(?<!TrainingArguments ){re.escape(p)}\b", said)]
        assert not left, f"a key path left in the generator's words: {said}"
    if refused is not None:
        assert _refused_count(refused) == len(errors), (str(refused), errors)
        for problem in errors:
            assert flag_with_value(problem.path, problem.value, spec).split(" ")[0] in str(refused), (problem, refused)
    else:
        assert len(warnings) == len(lint_warnings), (warnings, lint_warnings)
        for problem, warning in zip(lint_warnings, warnings, strict=True):
            assert flag_with_value(problem.path, problem.value, spec).split(" ")[0] in warning, (problem, warning)


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: "-".join(f"{k}{v}" for k, v in w.items()) or "no-world")
def test_each_option_alone_gets_the_same_answer_from_config_and_validate(world):
    for spec in (s for s in _one_at_a_time() if all(getattr(s, k) == v for k, v in world.items())):
        _check_agreement(spec)


def test_combinations_get_the_same_answer_from_config_and_validate():
    for spec in _sampled(SAMPLES):
        _check_agreement(spec)


def test_the_walk_reaches_every_rule_with_a_flag_form():
    """Every key path of the table that some linter rule speaks about shows up as a refusal or a warning in the
    walk, so the comparison above is not vacuous."""
    seen: set[str] = set()
    for spec in _one_at_a_time() + _sampled(SAMPLES):
        if number_problems(spec) or flag_problems(spec):
            continue
        try:
            config = map_options(spec, RunAdjustments())
        except UserError:
            continue
        seen |= {p.path for p in lint(config, lint_context(spec, _world(spec)))}
    expected = {
        "zero_optimization.offload_param.device",
        "zero_optimization.offload_optimizer.device",
        "zero_optimization.offload_param.nvme_path",
        "zero_optimization.offload_optimizer.nvme_path",
        "zero_optimization.zero_hpz_partition_size",
        "zero_optimization.zero_quantized_weights",
        "zero_optimization.zero_quantized_gradients",
        "bf16.bf16_master_weights_and_grads",
        "bf16.bf16_optimizer_states",
        "torch_autocast.enabled",
        "tensor_parallel.autotp_size",
    }
    # train_batch_size: no longer reached. The generator writes it only for plain DeepSpeed at a known world size,
    # where it is micro x accum x world by construction (--hf-auto leaves it out: issue 22).
    assert expected <= seen, sorted(expected - seen)


def test_the_hpz_severities_are_the_linters():
    """The case that used to disagree: a partition size not dividing the GPUs per node (secondary shards span
    nodes: DeepSpeed runs it, slower) is a warning in both; one not dividing the world size (DeepSpeed asserts) is
    an error in both."""
    spanning = ZeroSpec(stage=3, nodes=2, gpus_per_node=8, hpz_partition_size=16)
    assert len(generate(spanning).warnings) == 1
    json_problems = lint(map_options(spanning, RunAdjustments()), LintContext(world_size=16, ranks_per_node=8))
    assert [p.severity for p in json_problems] == ["warning"]
    with pytest.raises(UserError, match="--hpz-partition-size 3: does not divide the world size 8"):
        generate(ZeroSpec(stage=3, world_size=8, hpz_partition_size=3))


def test_every_table_option_has_a_flag():
    from zero_kit.cli import build_parser

    config_flags = {a for action in _config_parser(build_parser())._actions for a in action.option_strings}
    assert {flag(field) for field in KEY_FIELDS.values()} <= config_flags


def _config_parser(parser):
    import argparse

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["config"]


def test_tp_writes_the_section_deepspeed_parses_and_its_rules_speak_in_flags():
    """--tp N writes tensor_parallel.autotp_size, which DeepSpeed's own TPTrainingConfig reads back; with the
    model's heads (config --model) the head rules speak too, as validate --model says them."""
    from deepspeed.runtime.tensor_parallel.config import get_tensor_parallel_config

    config = generate(ZeroSpec(stage=2, world_size=8, tp=2)).config
    assert config["tensor_parallel"] == {"autotp_size": 2}
    assert get_tensor_parallel_config(config).autotp_size == 2
    assert "tensor_parallel" not in generate(ZeroSpec(stage=2, world_size=8)).config
    with pytest.raises(UserError, match=r"--tp\(3\) does not divide the world size\(8"):
        generate(ZeroSpec(stage=2, world_size=8, tp=3))
    (warning,) = [w for w in generate(ZeroSpec(stage=1, world_size=24, tp=3), heads=(32, 8)).warnings if "heads" in w]
    assert "does not divide the model's key-value heads(8)" in warning and "--tp 2" in warning
    json_problems = lint(map_options(ZeroSpec(stage=1, world_size=24, tp=3), RunAdjustments()),
                         LintContext(world_size=24, attention_heads=32, kv_heads=8))  # fmt: skip
    assert sum("key-value heads(8)" in p.message for p in json_problems) == 1

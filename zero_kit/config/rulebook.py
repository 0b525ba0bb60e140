"""The generator's side of the one rule book: it lints its own output with `zero_kit.lint.check_rules` (the rules
`zero-kit validate` applies to any JSON) and reports each problem in its own words, naming the flag that wrote the
key. Errors refuse (all at once), warnings are returned; the severity is always the linter's.

`KEY_FIELDS` is the table from key paths to the `ZeroSpec` field (so the flag) that writes them. A rule about a key
the table knows is a rule with a flag form: tests/unit/test_rulebook.py walks every such field and checks that
`zero-kit config` refuses exactly what `zero-kit validate` calls an error.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from zero_kit.config.spec import ZeroSpec
from zero_kit.errors import UserError
from zero_kit.lint import LintContext, Problem, check_rules

KEY_FIELDS: dict[str, str] = {
    "zero_optimization.stage": "stage",
    "zero_optimization.offload_param.device": "offload_param",
    "zero_optimization.offload_optimizer.device": "offload_optimizer",
    "zero_optimization.offload_param.nvme_path": "nvme_path",
    "zero_optimization.offload_optimizer.nvme_path": "nvme_path",
    "zero_optimization.offload_param.pin_memory": "pin_memory",
    "zero_optimization.offload_optimizer.pin_memory": "pin_memory",
    "zero_optimization.zero_hpz_partition_size": "hpz_partition_size",
    "zero_optimization.zero_quantized_weights": "quantized_weights",
    "zero_optimization.zero_quantized_gradients": "quantized_gradients",
    "zero_optimization.reduce_bucket_size": "hidden_size",
    "zero_optimization.stage3_prefetch_bucket_size": "hidden_size",
    "zero_optimization.stage3_param_persistence_threshold": "hidden_size",
    "zero_optimization.leaf_module": "leaf_module",
    "bf16.enabled": "precision",
    "fp16.enabled": "precision",
    "bf16.bf16_master_weights_and_grads": "bf16_master_weights",
    "bf16.bf16_optimizer_states": "bf16_optimizer_states",
    "torch_autocast.enabled": "torch_autocast",
    "train_batch_size": "global_batch",
    "train_micro_batch_size_per_gpu": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "gradient_clipping": "gradient_clipping",
    "optimizer.params.lr": "lr",
    "optimizer.params.weight_decay": "weight_decay",
    "tensor_parallel.autotp_size": "tp",
}
"""Key path -> the ZeroSpec field whose flag (--field-name) writes it."""

# Last path parts too generic to stand for one flag when a message names them alone.
_GENERIC = {"device", "enabled", "stage", "lr", "pin_memory", "bf16", "fp16", "weight_decay"}


def flag(field: str) -> str:
    """The command-line flag of a ZeroSpec field (the spelling `zero_kit.options` gives it)."""
    return "--" + field.replace("_", "-")


def _spellings() -> dict[str, str]:
    """Every way a lint message names a key of the table (full path, path inside zero_optimization, a distinctive
    last part, the section of an offload device), mapped to the flag."""
    names: dict[str, str] = {}
    for path, field in KEY_FIELDS.items():
        parts = path.split(".")
        names[path] = flag(field)
        inner = path.removeprefix("zero_optimization.")
        if "." in inner or inner not in _GENERIC:
            names.setdefault(inner, flag(field))
        if parts[-1] not in _GENERIC:
            names.setdefault(parts[-1], flag(field))
        if parts[-1] in ("device", "enabled") and len(parts) > 1 and parts[-2] not in _GENERIC:
            names.setdefault(parts[-2], flag(field))
    return names


@functools.cache
def _patterns() -> tuple[dict[str, str], re.Pattern, re.Pattern]:
    """The spellings and the two expressions that find them (compiled on the first message to translate: a config
    the linter finds nothing in never pays for them)."""
    names = _spellings()
    alternatives = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    # Not after "TrainingArguments ": the HF Trainer's own argument of the same name is no flag of ours.
    name_re = re.compile(r"(?<![\w.\-])(?<!TrainingArguments )(" + alternatives + r")\b")
    snippet_re = re.compile(r'"(' + alternatives + r')":\s*(true\b)?')
    return names, name_re, snippet_re


_UNDER_RE = re.compile(r" under [\w.]+")  # where a key goes in the JSON: no meaning on the command line
_DEVICE_RE = re.compile(r'\{"device": "(\w+)"\}')  # an offload section: its device is the flag's value
_FLAG_TO_RE = re.compile(r'(--[a-z0-9-]+) to (?:"([^"]*)"|(\d[\d.]*))')


def in_flag_words(text: str) -> str:
    """`text` with the key paths the table knows replaced by their flags ("add "nvme_path": ..." -> "add --nvme-path
    ..."), so a fix written for JSON reads as one for the command line."""
    names, name_re, snippet_re = _patterns()
    text = snippet_re.sub(lambda m: names[m.group(1)] + ("" if m.group(2) else " "), text)
    text = _DEVICE_RE.sub(r"\1", _UNDER_RE.sub("", text))
    text = text.replace("remove the key", "drop the flag").replace("remove it", "drop it")
    text = name_re.sub(lambda m: names[m.group(1)], text)
    # "set --stage to 3", '--offload-param to "none"', "disable --torch-autocast": as typed on the command line.
    return _FLAG_TO_RE.sub(lambda m: f"{m.group(1)} {m.group(2) or m.group(3)}", text).replace("disable --", "drop --")


def flag_with_value(path: str, value: Any, spec: ZeroSpec) -> str:
    """The flag that wrote `path`, as the user typed it ("--offload-param cpu", "--quantized-weights"); the key
    path itself when no flag writes it (a run adjustment or a strategy's override)."""
    field = KEY_FIELDS.get(path)
    if field is None:
        return path
    if field == "hpz_partition_size" and spec.hpz_partition_size is None:
        return f"--hpz (partition size {value} from --gpus-per-node)"
    given = getattr(spec, field)
    if isinstance(given, bool):
        return flag(field)
    return f"{flag(field)} {given}"


def _user_error(problem: Problem, spec: ZeroSpec) -> UserError:
    named = flag_with_value(problem.path, problem.value, spec)
    message = in_flag_words(problem.message)
    if named.split(" ")[0] not in message:
        message = f"{named}: {message}"
    return UserError(message, in_flag_words(problem.fix))


def lint_context(spec: ZeroSpec, world_size: int | None, heads: tuple[int, int] | None = None) -> LintContext:
    """What `zero-kit validate` would be told about this config, read off the flags (and the model's heads)."""
    source = "--world-size" if spec.world_size is not None else "--nodes x --gpus-per-node"
    return LintContext(
        world_size=world_size,
        world_size_source=source,
        target="hf-trainer" if spec.hf_auto else "deepspeed",
        device=spec.device,
        ranks_per_node=spec.gpus_per_node,
        attention_heads=heads[0] if heads else None,
        kv_heads=heads[1] if heads else None,
    )


def lint_generated(
    config: dict, spec: ZeroSpec, world_size: int | None, heads: tuple[int, int] | None = None
) -> tuple[list[UserError], list[str]]:
    """The rule book's errors and warnings about `config` (written from `spec`), in the generator's words."""
    problems = check_rules(config, lint_context(spec, world_size, heads))
    errors = [_user_error(p, spec) for p in problems if p.severity == "error"]
    warnings = [str(_user_error(p, spec)) for p in problems if p.severity == "warning"]
    return errors, warnings

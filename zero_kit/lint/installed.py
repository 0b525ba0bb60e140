"""Facts about the installed DeepSpeed beyond the keys its parser reads (that is `discover`): its version (and what
it does to Ulysses gradients at ZeRO-0/1/2), the
dtype spellings it resolves, the keys it removed, what optimizers and schedulers it can build and with which
parameters, the keys of its zero_optimization model, and the expected types of top-level keys whose default is None.
Everything is read off DeepSpeed (and torch) at run time and cached; the one exception is REMOVED_OPTIMIZERS,
names that only older releases know and the installed one therefore cannot tell us."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

from zero_kit.lint.discover import import_deepspeed

REMOVED_OPTIMIZERS = ("onebitadam", "zerooneadam", "onebitlamb")
"""1-bit optimizer types of DeepSpeed <= 0.18 (ONEBIT_ADAM_OPTIMIZER, ...). 0.19 dropped them from
DEEPSPEED_OPTIMIZERS, so its parse passes and `deepspeed.initialize` fails looking them up in torch.optim.
Where the installed DeepSpeed still lists them, their classes are read like any other optimizer's."""
_ONE_BIT_CLASSES = {"onebitadam": ("adam", "OnebitAdam"), "zerooneadam": ("zoadam", "ZeroOneAdam"),
                    "onebitlamb": ("lamb", "OnebitLamb")}  # fmt: skip
# Arithmetic that only a number survives; `+` is left out because strings concatenate.
_NUMERIC_OPS = (ast.Mod, ast.FloorDiv, ast.Mult, ast.Div, ast.Sub, ast.Pow)


@functools.cache
def deepspeed_version() -> str:
    """The installed DeepSpeed's version, named in messages about keys that only other releases accept."""
    import importlib.metadata  # here, not at the top: the linter's rule pass (in `zero-kit config`) never needs it

    try:
        return importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


SP_GRADIENTS_SCALED_FROM = "0.19.6"
"""The first DeepSpeed whose ZeRO-0/1/2 hand back Ulysses gradients sp x the group loss's (`ulysses_gradient_scale`).
Measured at ZeRO-2 by the global gradient norm against the same run at sp=1: exact on 0.18.3, 0.19.0, 0.19.4 and
0.19.5, 2x at sp=2 on 0.19.6, 0.19.7 and 0.19.8 (there ZeRO-0 and ZeRO-1 too); tests/dist/test_bench_compare.py
holds it for the installed release."""


def ulysses_gradient_scale(stage: int, sp: int) -> float:
    """What the gradient of a Ulysses group's loss must be multiplied by for DeepSpeed to reduce it to the mean
    gradient of the rows: 1/sp at ZeRO-0/1/2 on DeepSpeed SP_GRADIENTS_SCALED_FROM and later, else 1. The loss is the
    HF Trainer's under DeepSpeed SP (each rank's mean over its slice, weighed by its tokens through a differentiable
    all-gather; zero_kit.strategies.ulysses.group_loss), so a rank's gradient already holds the group's sp shares,
    and those releases' reduction returns sp x the mean gradient: the gradient norm comes out sp x the same run's at
    sp=1, gradient clipping cuts at 1/sp of its threshold and the Trainer logs an sp x grad_norm. ZeRO-3 is exact."""
    if sp <= 1 or stage >= 3:
        return 1.0
    from packaging.version import InvalidVersion, Version

    try:
        return 1.0 / sp if Version(deepspeed_version()) >= Version(SP_GRADIENTS_SCALED_FROM) else 1.0
    except InvalidVersion:  # "unknown": no DeepSpeed to judge
        return 1.0


@functools.cache
def zero_section_keys() -> frozenset[str]:
    """Every key DeepSpeed's zero_optimization model (DeepSpeedZeroConfig) accepts: field names and aliases
    (stage3_* keys are aliases of the fields)."""
    import_deepspeed()
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    fields = DeepSpeedZeroConfig.model_fields
    return frozenset([*fields, *(f.alias for f in fields.values() if f.alias)])


@functools.cache
def format_examples() -> dict[str, Any]:
    """Example values from the *_FORMAT help strings in deepspeed/runtime/constants.py ('"key": value' lines),
    the one place DeepSpeed writes down a value for keys whose default is None."""
    import_deepspeed()
    from deepspeed.runtime import constants

    examples: dict[str, Any] = {}
    for name, text in vars(constants).items():
        if not (name.endswith("_FORMAT") and isinstance(text, str)):
            continue
        for key, raw in re.findall(r'^\s*"(\w+)"\s*:\s*([^{\[\n]+?),?\s*$', text, flags=re.MULTILINE):
            try:
                examples.setdefault(key, json.loads(raw))
            except ValueError:
                continue  # placeholders such as [true|false]
    return examples


@functools.cache
def numeric_by_use() -> frozenset[str]:
    """Config attributes DeepSpeed does arithmetic with (`self.steps_per_print` in config.py, `self.steps_per_print()`
    in engine.py): their values must be numbers even where the parser keeps whatever it finds."""
    import_deepspeed()
    import deepspeed.runtime.config as ds_config
    import deepspeed.runtime.engine as ds_engine

    found: set[str] = set()
    for module in (ds_config, ds_engine):
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, _NUMERIC_OPS):
                operands = (node.left, node.right) if isinstance(node, ast.BinOp) else (node.target, node.value)
                found |= {name for operand in operands if (name := _self_attribute(operand))}
    return frozenset(found)


def _self_attribute(node: ast.AST) -> str | None:
    """ "x" for `self.x` or `self.x()`, else None."""
    if isinstance(node, ast.Call) and not node.args:
        node = node.func
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


@functools.cache
def dtype_names() -> tuple[str, ...]:
    """The dtype spellings DeepSpeed's DtypeEnum resolves ("bf16", "bfloat16", "torch.bfloat16", ...)."""
    from deepspeed.runtime.config import DtypeEnum

    return tuple(v for v in DtypeEnum._value2member_map_ if isinstance(v, str))


@functools.cache
def removed_keys() -> dict[str, str]:
    """Keys DeepSpeed rejects outright (removed features), with DeepSpeed's own message."""
    import_deepspeed()
    import deepspeed.runtime.config as ds_config

    top = getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    zero = getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})
    return {**top, **{f"zero_optimization.{k}": v for k, v in zero.items()}}


def _parameters(cls: Any, skip: int) -> tuple[dict[str, Any], bool]:
    """Keyword parameters of `cls.__init__` after the first `skip` (self, params...), and whether **kwargs is taken."""
    sig = inspect.signature(cls)
    names, open_ = {}, False
    for i, (name, p) in enumerate(sig.parameters.items()):
        if p.kind is p.VAR_KEYWORD:
            open_ = True
        elif i >= skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names[name] = None if p.default is p.empty else p.default
    return names, open_


def _optimizer_classes(name: str) -> tuple[list[Any], dict[str, Any]]:
    """The classes DeepSpeed may build for optimizer `name` (which one depends on offload/torch_adam),
    and the extra keys DeepSpeed pops from params before calling them (engine._configure_basic_optimizer)."""
    import torch
    from deepspeed.runtime import config as ds_config

    lowered = name.lower() if name.lower() in ds_config.DEEPSPEED_OPTIMIZERS else name
    if lowered in (ds_config.ADAM_OPTIMIZER, ds_config.ADAMW_OPTIMIZER):
        from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

        extras = {ds_config.ADAM_W_MODE: True, ds_config.TORCH_ADAM_PARAM: False, "fp32_optimizer_states": True}
        return [FusedAdam, DeepSpeedCPUAdam, torch.optim.AdamW], extras
    if lowered == ds_config.ADAGRAD_OPTIMIZER:
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return [DeepSpeedCPUAdagrad, torch.optim.Adagrad], {}
    if lowered == ds_config.LAMB_OPTIMIZER:
        from deepspeed.ops.lamb import FusedLamb

        return [FusedLamb], {}
    if lowered == ds_config.LION_OPTIMIZER:
        from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

        return [DeepSpeedCPULion, FusedLion], {}
    if lowered in REMOVED_OPTIMIZERS and lowered in ds_config.DEEPSPEED_OPTIMIZERS:  # DeepSpeed <= 0.18 has them
        module, cls_name = _ONE_BIT_CLASSES[lowered]
        return [getattr(importlib.import_module(f"deepspeed.runtime.fp16.onebit.{module}"), cls_name)], {}
    torch_cls = getattr(torch.optim, name, None)
    if isinstance(torch_cls, type) and issubclass(torch_cls, torch.optim.Optimizer):
        return [torch_cls], {}
    return [], {}


@functools.cache
def optimizer_choices() -> tuple[str, ...]:
    """Optimizer `type` values DeepSpeed can build: its own names plus torch.optim classes."""
    import torch
    from deepspeed.runtime import config as ds_config

    torch_names = [
        n for n, c in vars(torch.optim).items() if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)
    ]
    return tuple(ds_config.DEEPSPEED_OPTIMIZERS) + tuple(n for n in torch_names if n != "Optimizer")


@functools.cache
def optimizer_parameters(name: str) -> tuple[dict[str, Any], bool] | None:
    """Accepted `optimizer.params` keys (with defaults) for optimizer `name`, and whether any key goes.
    None if DeepSpeed cannot build `name`."""
    from deepspeed.runtime import config as ds_config

    if name.lower() in (ds_config.MUADAM_OPTIMIZER, ds_config.MUADAMW_OPTIMIZER, ds_config.MUSGD_OPTIMIZER):
        return {}, True  # built by the optional `mup` package, whose signature we cannot read here
    if name.lower() == ds_config.MUON_OPTIMIZER:
        return {}, True
    classes, extras = _optimizer_classes(name)
    if not classes:
        return None
    accepted, open_ = dict(extras), False
    for cls in classes:
        names, cls_open = _parameters(cls, skip=1)
        names.pop("deepspeed", None)  # the 1-bit optimizers' engine argument, passed by DeepSpeed itself
        accepted.update({k: v for k, v in names.items() if k not in accepted})
        open_ = open_ or cls_open
    return accepted, open_


@functools.cache
def scheduler_parameters(name: str) -> tuple[dict[str, Any], bool] | None:
    """Accepted `scheduler.params` keys for scheduler `name` (DeepSpeed's lr_schedules, then torch's)."""
    import torch
    from deepspeed.runtime import lr_schedules

    cls = getattr(lr_schedules, name, None) or getattr(torch.optim.lr_scheduler, name, None)
    if not isinstance(cls, type):
        return None
    return _parameters(cls, skip=1)


@functools.cache
def scheduler_choices() -> tuple[str, ...]:
    """Scheduler `type` values DeepSpeed can build: its lr_schedules plus torch's LR schedulers."""
    import torch
    from deepspeed.runtime import lr_schedules

    base = torch.optim.lr_scheduler.LRScheduler
    torch_names = [n for n, c in vars(torch.optim.lr_scheduler).items() if isinstance(c, type) and issubclass(c, base)]
    return tuple(lr_schedules.VALID_LR_SCHEDULES) + tuple(torch_names)


@functools.cache
def engine_source() -> str:
    """The installed DeepSpeed's runtime/engine.py as text, found without importing deepspeed (the generator's rule
    pass must stay fast): the AutoTP facts below are read off it. Empty when DeepSpeed is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return ""
    path = Path(next(iter(spec.submodule_search_locations))) / "runtime" / "engine.py"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def autotp_refuses_zero3() -> bool:
    """The installed engine asserts ZeRO stage <= 2 when AutoTP training starts (0.18.3 `_configure_tensor_parallel_
    states`: "the compatibility between 'autotp' and 'zero_stage = 3' has not been validated"; 0.19.8 supports it)."""
    return bool(re.search(r"assert\s+self\.zero_optimization_stage\(\s*\)\s*<=\s*2", engine_source()))


def autotp_shards_from_config() -> bool:
    """The installed engine shards the model itself from tensor_parallel.autotp_size (0.19.8
    `_apply_autotp_partitioning`). 0.18.3 only builds the TP groups: the model is sharded by
    `deepspeed.tp_model_init`, which the script (or transformers) must call before `deepspeed.initialize`."""
    return "def _apply_autotp_partitioning" in engine_source()

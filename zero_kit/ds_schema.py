"""DeepSpeed's config schema, learned from DeepSpeed itself (never re-typed by hand).

Most of DeepSpeed's config is *not* a pydantic model: `DeepSpeedConfig` reads the top level and
sections such as `optimizer`, `checkpoint` or `flops_profiler` with `get()`, `in` and `.keys()`,
and silently ignores every key it never asks for. So we run DeepSpeed's own parser over dicts
that record which keys it asks for (and the default it offers, which tells the expected type),
and over section probes that reveal which pydantic model a section is handed to. The result is
cached: one discovery per process, a few hundred milliseconds after `import deepspeed`.

Also here: the "auto" keys that the Hugging Face Trainer fills, learned the same way by running
its `trainer_config_process` / `trainer_config_finalize` against a recording stand-in.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import io
import logging
import sys
from collections.abc import KeysView
from dataclasses import dataclass, field
from typing import Any
from unittest import mock


@functools.cache
def import_deepspeed() -> None:
    """Import deepspeed once, with its import-time log lines sent to stderr: stdout may carry --json output."""
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed.runtime.config  # noqa: F401


# Marker key put into a probed section; a model constructor that receives it tells us its class.
_MARKER = "__zero_kit_probe__"
_UNSET = object()
# The batch keys are always present during discovery so that DeepSpeed's batch logic passes.
_BATCH = {"train_batch_size": 1}


@dataclass
class Schema:
    """What DeepSpeed reads. Paths are dotted key paths ("" is the top level)."""

    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Known keys per dict path, mapped to the default DeepSpeed offers for them (or None)."""
    models: dict[str, type] = field(default_factory=dict)
    """Dict paths that DeepSpeed hands to a pydantic model, and that model class."""
    open_paths: set[str] = field(default_factory=set)
    """Dict paths whose keys DeepSpeed iterates (any key is accepted there)."""


class _Recorder:
    """Shared log of every key DeepSpeed looked up, per path."""

    def __init__(self) -> None:
        self.reads: dict[str, dict[str, Any]] = {}
        self.models: dict[str, type] = {}
        self.iterated: set[str] = set()

    def read(self, path: str, key: Any, default: Any = _UNSET) -> None:
        if isinstance(key, str) and key != _MARKER:
            seen = self.reads.setdefault(path, {})
            if seen.get(key) is None:
                seen[key] = None if default is _UNSET else default


class _Keys(KeysView):
    def __init__(self, owner: _Probe) -> None:
        super().__init__(owner)
        self._owner = owner

    def __contains__(self, key: object) -> bool:
        self._owner._rec.read(self._owner._path, key)
        return dict.__contains__(self._owner, key)

    def __iter__(self):
        self._owner._rec.iterated.add(self._owner._path)
        return (k for k in dict.__iter__(self._owner) if k != _MARKER)


class _Probe(dict):
    """A dict that logs the keys it is asked for."""

    def __init__(self, data: dict, rec: _Recorder, path: str) -> None:
        super().__init__(data)
        self._rec = rec
        self._path = path

    def get(self, key, default=None):
        self._rec.read(self._path, key, default)
        return super().get(key, default)

    def __getitem__(self, key):
        self._rec.read(self._path, key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self._rec.read(self._path, key)
        return super().__contains__(key)

    def keys(self):
        return _Keys(self)

    def items(self):
        self._rec.iterated.add(self._path)
        return super().items()

    def __copy__(self):
        return self


def _unwrap_model(annotation: Any) -> type | None:
    """`Optional[SomeModel]` -> SomeModel; anything else that is not a pydantic model -> None."""
    from pydantic import BaseModel

    candidates = [annotation, *getattr(annotation, "__args__", ())]
    for cand in candidates:
        if isinstance(cand, type) and issubclass(cand, BaseModel):
            return cand
    return None


def _patched_model_init(rec: _Recorder, original):
    """DeepSpeedConfigModel.__init__ that notes which model class a probed section was given to."""

    def init(self, strict=False, **data):
        marker = data.pop(_MARKER, None)
        if marker is not None:
            rec.models.setdefault(marker, type(self))
        for name, value in list(data.items()):
            if isinstance(value, dict) and _MARKER in value:
                nested = (
                    _unwrap_model(type(self).model_fields[name].annotation) if name in type(self).model_fields else None
                )
                if nested is not None:
                    rec.models.setdefault(value[_MARKER], nested)
                data[name] = {k: v for k, v in value.items() if k != _MARKER}
        return original(self, strict=strict, **data)

    return init


class _FakeDist:
    """Stands in for `deepspeed.comm` so that `DeepSpeedConfig` sees a world size without a process group."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def get_rank(self, *args: Any) -> int:
        return 0

    def get_world_size(self, *args: Any) -> int:
        return self.world_size


@contextlib.contextmanager
def _quiet():
    """DeepSpeed logs warnings while parsing; a linter reports them as Problems instead."""
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def deepspeed_parse(config: dict, world_size: int) -> str | None:
    """Run DeepSpeed's own `DeepSpeedConfig` parse at `world_size`; its error message, or None if it accepts."""
    import_deepspeed()
    import deepspeed.runtime.config as ds_config

    with _quiet(), mock.patch.object(ds_config, "dist", _FakeDist(world_size)):
        try:
            ds_config.DeepSpeedConfig(config)
        except Exception as err:  # DeepSpeed raises assert/Value/Type/KeyError alike for bad configs
            return f"{type(err).__name__}: {err}".strip()
    return None


def _parse_quietly(config: dict) -> None:
    """Run DeepSpeed's parser, ignoring the outcome (discovery only wants the reads)."""
    deepspeed_parse(config, 1)


def _probe(rec: _Recorder, path: str) -> _Probe:
    return _Probe({_MARKER: path}, rec, path)


def _config_with_section(rec: _Recorder, path: str) -> _Probe:
    """A minimal config whose `path` (a.b.c) is an (empty) probe, every parent a probe too."""
    parts = path.split(".")
    inner: dict = _probe(rec, path)
    for depth in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:depth])
        node = _probe(rec, parent)
        dict.__setitem__(node, parts[depth], inner)
        inner = node
    top = _Probe(dict(_BATCH), rec, "")
    dict.__setitem__(top, parts[0], inner)
    return top


@functools.cache
def discover() -> Schema:
    """Learn DeepSpeed's config schema by running its parser over recording dicts."""
    import_deepspeed()
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    rec = _Recorder()
    with mock.patch.object(DeepSpeedConfigModel, "__init__", _patched_model_init(rec, DeepSpeedConfigModel.__init__)):
        _parse_quietly(_Probe(dict(_BATCH), rec, ""))
        explored: set[str] = set()
        # Breadth first: every key read becomes a probed section; if DeepSpeed reads keys inside it
        # (or hands it to a model), it is a section and we go one level deeper.
        frontier = [k for k in rec.reads.get("", {}) if k not in _BATCH]
        while frontier:
            path = frontier.pop()
            if path in explored or path.count(".") > 3:
                continue
            explored.add(path)
            _parse_quietly(_config_with_section(rec, path))
            if path not in rec.models and path not in rec.iterated:
                frontier += [f"{path}.{k}" for k in rec.reads.get(path, {})]
    keys = {path: reads for path, reads in rec.reads.items() if path not in rec.models}
    # DeepSpeed reads `params` of optimizer/scheduler only once `type` is set; their contents are
    # checked against the optimizer/scheduler class signatures instead (see `call_parameters`).
    for section in ("optimizer", "scheduler"):
        keys.setdefault(section, {}).setdefault("params", {})
    return Schema(keys=keys, models=rec.models, open_paths=rec.iterated | {"optimizer.params", "scheduler.params"})


@functools.cache
def dtype_names() -> tuple[str, ...]:
    """The dtype spellings DeepSpeed's DtypeEnum resolves ("bf16", "bfloat16", "torch.bfloat16", ...)."""
    from deepspeed.runtime.config import DtypeEnum

    return tuple(v for v in DtypeEnum._value2member_map_ if isinstance(v, str))


@functools.cache
def removed_keys() -> dict[str, str]:
    """Keys DeepSpeed rejects outright (removed features), with DeepSpeed's own message."""
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


class _Anything:
    """Stand-in TrainingArguments / model: every attribute is 1, every call returns 1."""

    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return 1

    def __mul__(self, other: Any) -> int:
        return 1

    __rmul__ = __mul__
    __index__ = __int__ = lambda self: 1  # noqa: E731


@functools.cache
def hf_trainer_auto_keys() -> frozenset[str]:
    """Key paths whose "auto" the HF Trainer fills, read off transformers' own fill calls."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    filled: set[str] = set()

    class Stand:
        config: dict = {}

        def fill_match(self, ds_key_long, *args, **kwargs):
            filled.add(ds_key_long)

        fill_only = fill_match

        def is_auto(self, ds_key_long):
            return True

        def is_true(self, ds_key_long):
            return False

        def is_zero3(self):
            return True

    stand, args = Stand(), _Anything()
    for step, extra in (("trainer_config_process", ()), ("trainer_config_finalize", (_Anything(), 1))):
        with contextlib.suppress(Exception):
            getattr(HfTrainerDeepSpeedConfig, step)(stand, args, *extra)
    return frozenset(filled)


# ---------------------------------------------------------------------------------------------
# Checking a config against the discovered schema.
# ---------------------------------------------------------------------------------------------


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an object" if isinstance(value, dict) else "a list"


def _annotation_kinds(annotation: Any) -> set[str] | None:
    """JSON kinds a pydantic annotation accepts; None when we cannot tell (then pydantic alone decides)."""
    import enum
    import typing

    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _annotation_kinds(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return {_json_kind(v) for v in typing.get_args(annotation)}
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        kinds: set[str] = set()
        for arg in typing.get_args(annotation):
            sub = _annotation_kinds(arg)
            if sub is None:
                return None
            kinds |= sub
        return kinds
    simple = {
        bool: "true/false",
        int: "a number",
        float: "a number",
        str: "a string",
        type(None): "null",
        dict: "an object",
    }
    if annotation in simple:
        return {simple[annotation]}
    if origin in (list, tuple, set) or annotation in (list, tuple):
        return {"a list"}
    if origin is dict:
        return {"an object"}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {_json_kind(m.value) for m in annotation}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {"an object"}
    return None


def _default_kinds(default: Any) -> set[str] | None:
    """JSON kinds accepted where DeepSpeed reads a key with `get(key, default)`; None: unknown.
    A string default says little (e.g. data_types.keep_in_fp32_modules is "auto" or a list), so no check."""
    if isinstance(default, bool):
        return {"true/false"}
    if isinstance(default, (int, float)):
        return {"a number"}
    if isinstance(default, (list, tuple)):
        return {"a list"}
    return {"an object"} if isinstance(default, dict) else None


def _is_typo(key: str, known: str) -> bool:
    """A misspelling of `known`: equal ignoring case, or at most 2 edits away (1 for short keys).
    Longer differences ("sequence_parallel" vs "sequence_parallel_size") are more likely another tool's key."""
    a, b = key.lower(), known.lower()
    limit = 1 if len(b) <= 6 else 2
    if abs(len(a) - len(b)) > limit:
        return False
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1] <= limit


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text.strip().lower() in ("true", "false")
    return True


class _Walk:
    """One pass over a config: unknown keys, wrong types, removed and deprecated keys, "auto" locations."""

    def __init__(self, config: dict) -> None:
        from zero_kit.lint import Problem

        self.config = config
        self.schema = discover()
        self.removed = removed_keys()
        self.problems: list[Problem] = []
        self.autos: list[str] = []
        self.dropped: dict[str, Any] = {}
        self._problem = Problem

    def add(self, severity: str, path: str, value: Any, message: str, fix: str = "") -> None:
        self.problems.append(self._problem(severity, path, value, message, fix))

    def unknown(self, path: str, key: Any, value: Any, choices: Any, where: str, *, rejected: bool) -> None:
        """`rejected`: DeepSpeed (or the class it builds) raises on this key. Otherwise DeepSpeed silently
        ignores it: an error when it is a near miss of a real key (the setting is lost), else a warning
        (tools such as LLaMA-Factory write keys DeepSpeed never reads)."""
        from zero_kit.lint import did_you_mean

        if rejected:
            message, severity = f"unknown key {key!r} in {where}: DeepSpeed rejects it", "error"
        elif any(_is_typo(str(key), c) for c in choices if isinstance(c, str)):
            message, severity = f"unknown key {key!r} in {where}: DeepSpeed silently ignores it", "error"
        elif str(key).startswith("_"):
            return  # "_comment"-style keys: ignored by DeepSpeed, and meant to be
        else:
            message, severity = f"unknown key {key!r} in {where}: DeepSpeed ignores it", "warning"
        self.add(severity, path, value, message, did_you_mean(key, choices))

    def typed(self, path: str, value: Any, kinds: set[str] | None) -> None:
        if kinds is None or value is None or _json_kind(value) in kinds:
            return
        expected = " or ".join(sorted(kinds - {"null"})) or "null"
        if isinstance(value, str) and kinds & {"a number", "true/false"} and _looks_numeric(value):
            self.add(
                "error", path, value, f"expected {expected}, found a string", f"write {value.strip()} without quotes"
            )
        else:
            self.add("error", path, value, f"expected {expected}, found {_json_kind(value)}", f"write {expected} here")

    def section(self, data: dict, path: str) -> None:
        known = {k: v for k, v in self.schema.keys.get(path, {}).items() if _join(path, k) not in self.removed}
        where = f"{path!r}" if path else "the top level"
        for key, value in data.items():
            here = _join(path, key)
            if here in self.removed:
                self.add("error", here, value, self.removed[here], "remove this key")
            elif here in self.schema.models:
                self.model_section(self.schema.models[here], value, here)
            elif key not in known and path not in self.schema.open_paths:
                self.unknown(here, key, value, known, where, rejected=False)
            elif key in known:
                self.value(here, value, known[key])

    def value(self, path: str, value: Any, default: Any) -> None:
        if value == "auto":
            if default != "auto":
                self.autos.append(path)
        elif path in ("optimizer.params", "scheduler.params"):
            self.call_params(path, value)
        elif path in self.schema.keys and path not in self.schema.open_paths:
            if isinstance(value, dict):
                self.section(value, path)
            else:
                self.add(
                    "error",
                    path,
                    value,
                    f"expected an object, found {_json_kind(value)}",
                    "write {...} with its settings here",
                )
        else:
            self.typed(path, value, _default_kinds(default))

    def call_params(self, path: str, params: Any) -> None:
        """optimizer.params / scheduler.params: keyword arguments of the class DeepSpeed will build."""
        section = path.split(".")[0]
        kind = lookup_type = self.config[section].get("type")
        if not isinstance(params, dict):
            self.add(
                "error",
                path,
                params,
                f"expected an object, found {_json_kind(params)}",
                "write {...} with keyword arguments",
            )
            return
        if not isinstance(lookup_type, str):
            return  # reported by the type check on `type`
        accepted = (optimizer_parameters if section == "optimizer" else scheduler_parameters)(kind)
        if accepted is None:
            return
        names, open_ = accepted
        for key, value in params.items():
            here = _join(path, key)
            if key == "max_grad_norm" and section == "optimizer":
                self.add(
                    "error",
                    here,
                    value,
                    "DeepSpeed refuses max_grad_norm as an optimizer parameter",
                    "remove it and set the top-level gradient_clipping instead",
                )
            elif key not in names and not open_:
                self.unknown(here, key, value, names, f"the parameters of {section} {kind!r}", rejected=True)
            elif value == "auto":
                self.autos.append(here)
            elif key in names:
                self.typed(here, value, _default_kinds(names[key]))

    def model_fields(self, cls: type, data: dict, path: str) -> None:
        fields = cls.model_fields
        aliases = {f.alias: name for name, f in fields.items() if f.alias}
        for key, value in data.items():
            here = _join(path, key)
            name = key if key in fields else aliases.get(key)
            if here in self.removed:
                self.add("error", here, value, self.removed[here], "remove this key")
                continue
            if name is None:
                self.unknown(here, key, value, [*fields, *aliases], f"{path!r}", rejected=True)
                continue
            info = fields[name]
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get("deprecated"):
                new = extra.get("new_param", "")
                fix = f"use {new!r} instead" if new else "remove it"
                self.add("warning", here, value, f"{key!r} is deprecated in DeepSpeed", fix)
            if value == "auto":
                if info.default != "auto":
                    self.autos.append(here)
                    if path in self.schema.models:  # DeepSpeedConfigModel.__init__ drops it: the default applies
                        self.dropped[here] = info.default
                continue
            sub = _unwrap_model(info.annotation)
            if sub is not None and isinstance(value, dict):
                self.model_fields(sub, value, here)
            else:
                self.typed(here, value, _annotation_kinds(info.annotation))

    def model_section(self, cls: type, data: Any, path: str) -> None:
        """A section DeepSpeed hands to a pydantic model: walk it, then let the model validate it."""
        if not isinstance(data, dict):
            self.add(
                "error",
                path,
                data,
                f"expected an object, found {_json_kind(data)}",
                "write {...} with its settings here",
            )
            return
        self.model_fields(cls, data, path)
        reported = {p.path for p in self.problems}
        try:
            with _quiet():
                cls(**_without_auto(data))
        except Exception as err:  # pydantic ValidationError, or DeepSpeed's own asserts in validators
            for path_, value, message, fix in _pydantic_errors(err, path):
                if path_ not in reported:
                    self.add("error", path_, value, message, fix)


_BOUNDS = {"gt": "greater than", "ge": "at least", "lt": "less than", "le": "at most"}


def _pydantic_fix(error: dict) -> str:
    """What to write instead, from the pydantic error's context (allowed values, bounds)."""
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        return f"use one of {ctx['expected']}"
    for bound, words in _BOUNDS.items():
        if bound in ctx:
            return f"use a value {words} {ctx[bound]}"
    if error.get("type") == "int_from_float":
        return "write a whole number"
    return "correct the value as the message says"


def _pydantic_errors(err: Exception, path: str) -> list[tuple[str, Any, str, str]]:
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return [(path, None, f"DeepSpeed rejects this section: {err}", "correct the section as the message says")]
    out = []
    for e in errors():
        here = path
        for part in e.get("loc", ()):
            here = _join(here, part)
        out.append((here, e.get("input"), e.get("msg", "invalid value"), _pydantic_fix(e)))
    return out


def _without_auto(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_auto(v) for k, v in data.items() if v != "auto"}
    return data


def _join(path: str, key: Any) -> str:
    from zero_kit.lint import join

    return join(path, key)


def check_schema(config: dict) -> tuple[list[Any], list[str], dict[str, Any]]:
    """Problems against DeepSpeed's schema; the key paths holding an "auto" DeepSpeed itself would not accept;
    and among those, the ones DeepSpeed silently drops (top level of a model section), with the default it uses."""
    walk = _Walk(config)
    walk.section(config, "")
    optimizer_type = lookup_type(config, "optimizer", optimizer_choices)
    scheduler_type = lookup_type(config, "scheduler", scheduler_choices)
    for found in (optimizer_type, scheduler_type):
        if found:
            walk.add(*found)
    return walk.problems, walk.autos, walk.dropped


def lookup_type(config: dict, section: str, choices) -> tuple | None:
    """The problem with `<section>.type`, if any: missing, not a string, or not something DeepSpeed can build."""
    from zero_kit.lint import did_you_mean

    node = config.get(section)
    if not isinstance(node, dict) or node.get("type") == "auto":
        return None
    path, kind = f"{section}.type", node.get("type")
    if kind is None:
        return (
            "warning",
            path,
            None,
            f"{section} has no 'type', so DeepSpeed ignores the whole section",
            f'add "type", e.g. {choices()[0]!r}',
        )
    if not isinstance(kind, str):
        return (
            "error",
            path,
            kind,
            f"expected a string, found {_json_kind(kind)}",
            f"use one of {', '.join(choices()[:6])}",
        )
    builds = optimizer_parameters(kind) if section == "optimizer" else scheduler_parameters(kind)
    if builds is None:
        return ("error", path, kind, f"DeepSpeed cannot build {section} {kind!r}", did_you_mean(kind, choices()))
    return None


def check_with_deepspeed(config: dict, world_size: int, filled_autos: list[str]) -> list[Any]:
    """DeepSpeed's own parse as the last word, at `world_size`, with the "auto" values that the
    target fills (`filled_autos`) taken out (and the batch triple made whole, as the Trainer would)."""
    from zero_kit.lint import BATCH_KEYS, ROOT, Problem

    clean = copy.deepcopy(config)
    for path in filled_autos:
        *parents, last = path.split(".")
        node = functools.reduce(lambda d, k: d.get(k, {}), parents, clean)
        node.pop(last, None)
    if any(k in filled_autos for k in BATCH_KEYS):
        micro = clean.setdefault("train_micro_batch_size_per_gpu", 1)
        accum = clean.setdefault("gradient_accumulation_steps", 1)
        clean["train_batch_size"] = micro * accum * world_size
    message = deepspeed_parse(clean, world_size)
    if message is None:
        return []
    path = _path_named_in(config, message) or ROOT
    return [
        Problem(
            "error",
            path,
            lookup_value(config, path),
            f"DeepSpeed's own parser rejects the config: {message}",
            "fix the value DeepSpeed names",
        )
    ]


def lookup_value(config: dict, path: str) -> Any:
    from zero_kit.lint import lookup

    return lookup(config, path)


def _path_named_in(config: dict, message: str, prefix: str = "") -> str | None:
    """The deepest key path of `config` whose last key appears in DeepSpeed's message."""
    best = None
    for key, value in config.items():
        here = f"{prefix}.{key}" if prefix else key
        if isinstance(key, str) and key in message:
            best = here
        if isinstance(value, dict):
            best = _path_named_in(value, message, here) or best
    return best

"""Check a DeepSpeed config against the schema `ds_schema` learns from DeepSpeed itself.

`check_schema` walks the config once: unknown keys (with "did you mean"), wrong JSON types, removed and
deprecated keys, and where "auto" stands; sections DeepSpeed hands to a pydantic model are also validated by
that model. DeepSpeed's own parse, the last word, is `ds_parse`. `lint.lint` calls `check_schema`.
"""

from __future__ import annotations

from typing import Any

from zero_kit.lint.discover import discover, quiet, unwrap_model
from zero_kit.lint.installed import (
    REMOVED_OPTIMIZERS,
    deepspeed_version,
    format_examples,
    numeric_by_use,
    optimizer_choices,
    optimizer_parameters,
    removed_keys,
    scheduler_choices,
    scheduler_parameters,
    zero_section_keys,
)
from zero_kit.lint.problem import Problem, Target, did_you_mean, join


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

    def __init__(self, config: dict, target: Target) -> None:
        self.config, self.target = config, target
        self.schema = discover()
        self.removed = removed_keys()
        self.problems: list[Problem] = []
        self.autos: list[str] = []
        self.dropped: dict[str, Any] = {}

    def add(self, severity: str, path: str, value: Any, message: str, fix: str = "") -> None:
        self.problems.append(Problem(severity, path, value, message, fix))

    def not_object(self, path: str, value: Any, fix: str = "write {...} with its settings here") -> None:
        self.add("error", path, value, f"expected an object, found {_json_kind(value)}", fix)

    def unknown(self, path: str, key: Any, value: Any, choices: Any, where: str, *, rejected: bool) -> None:
        """`rejected`: DeepSpeed (or the class it builds) raises on this key. Otherwise DeepSpeed silently
        ignores it: an error when it is a near miss of a real key (the setting is lost), else a warning
        (tools such as LLaMA-Factory write keys DeepSpeed never reads)."""
        if rejected:
            message, severity = f"unknown key {key!r} in {where}: DeepSpeed rejects it", "error"
        elif any(_is_typo(str(key), c) for c in choices if isinstance(c, str)):
            message, severity = f"unknown key {key!r} in {where}: DeepSpeed silently ignores it", "error"
        elif str(key).startswith("_"):
            return  # "_comment"-style keys: ignored by DeepSpeed, and meant to be
        else:
            message, severity = f"unknown key {key!r} in {where}: DeepSpeed ignores it", "warning"
        self.add(severity, path, value, message, did_you_mean(key, choices))

    def typed(self, path: str, value: Any, kinds: set[str] | None, why: str = "") -> None:
        if kinds is None or value is None or _json_kind(value) in kinds:
            return
        expected = " or ".join(sorted(kinds - {"null"})) or "null"
        message = f"expected {expected}, found {_json_kind(value)}{why}"
        if isinstance(value, str) and kinds & {"a number", "true/false"} and _looks_numeric(value):
            self.add("error", path, value, message, f"write {value.strip()} without quotes")
        else:
            self.add("error", path, value, message, f"write {expected} here")

    def removed_key(self, path: str, value: Any) -> None:
        message = (
            f"{self.removed[path].strip()} The installed DeepSpeed {deepspeed_version()} refuses the whole config"
            " with this key; it is valid only on older DeepSpeed releases"
        )
        self.add(
            "error", path, value, message, "remove this key, or pin the older DeepSpeed the config was written for"
        )

    def misplaced_zero_key(self, key: str, value: Any) -> None:
        """A zero_optimization key at the top level: DeepSpeed never looks there, so e.g. no offload happens."""
        message = (
            f"{key!r} belongs to zero_optimization; at the top level DeepSpeed silently ignores it"
            " (the run goes ahead without this setting, e.g. without any offload)"
        )
        self.add(
            "error", key, value, message, f'move it under zero_optimization: "zero_optimization": {{"{key}": ...}}'
        )

    def section(self, data: dict, path: str) -> None:
        known = {k: v for k, v in self.schema.keys.get(path, {}).items() if join(path, k) not in self.removed}
        where = f"{path!r}" if path else "the top level"
        for key, value in data.items():
            here = join(path, key)
            if here in self.removed:
                self.removed_key(here, value)
            elif here in self.schema.models:
                self.model_section(self.schema.models[here], value, here)
            elif not path and key not in known and key in zero_section_keys():
                self.misplaced_zero_key(key, value)
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
                self.not_object(path, value)
        elif "." not in path and default is None:
            self.typed(path, value, *_top_level_kinds(path))
        else:
            self.typed(path, value, _default_kinds(default))

    def call_params(self, path: str, params: Any) -> None:
        """optimizer.params / scheduler.params: keyword arguments of the class DeepSpeed will build."""
        section = path.split(".")[0]
        kind = lookup_type = self.config[section].get("type")
        if not isinstance(params, dict):
            self.not_object(path, params, "write {...} with keyword arguments")
            return
        if not isinstance(lookup_type, str):
            return  # reported by the type check on `type`
        accepted = (optimizer_parameters if section == "optimizer" else scheduler_parameters)(kind)
        if accepted is None:
            return
        names, open_ = accepted
        for key, value in params.items():
            here = join(path, key)
            if key == "max_grad_norm" and section == "optimizer":
                self.max_grad_norm(here, value)
            elif key not in names and not open_:
                self.unknown(here, key, value, names, f"the parameters of {section} {kind!r}", rejected=True)
            elif value == "auto":
                self.autos.append(here)
            elif key in names:
                self.typed(here, value, _default_kinds(names[key]))

    def max_grad_norm(self, path: str, value: Any) -> None:
        """DeepSpeed refuses max_grad_norm only where it builds the optimizer from this section itself
        (engine._configure_basic_optimizer), which it skips when the script passes its own optimizer."""
        refuses = "DeepSpeed refuses max_grad_norm as an optimizer parameter (ValueError in deepspeed.initialize)"
        fix = "remove it and set the top-level gradient_clipping instead"
        if self.target == "deepspeed":
            message = f"{refuses} when it builds the optimizer from this section, i.e. when the script passes none"
            self.add("warning", path, value, message + "; a script passing its own optimizer never reads it", fix)
        else:
            message = f"{refuses}; the {self.target} integration lets DeepSpeed build the optimizer of this section"
            self.add("error", path, value, message, fix)

    def model_fields(self, cls: type, data: dict, path: str) -> None:
        fields = cls.model_fields
        aliases = {f.alias: name for name, f in fields.items() if f.alias}
        for key, value in data.items():
            here = join(path, key)
            name = key if key in fields else aliases.get(key)
            if here in self.removed:
                self.removed_key(here, value)
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
            sub = unwrap_model(info.annotation)
            if sub is not None and isinstance(value, dict):
                self.model_fields(sub, value, here)
            else:
                self.typed(here, value, _annotation_kinds(info.annotation))

    def model_section(self, cls: type, data: Any, path: str) -> None:
        """A section DeepSpeed hands to a pydantic model: walk it, then let the model validate it."""
        if not isinstance(data, dict):
            self.not_object(path, data)
            return
        self.model_fields(cls, data, path)
        reported = {p.path for p in self.problems}
        try:
            with quiet():
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
            here = join(here, part)
        out.append((here, e.get("input"), e.get("msg", "invalid value"), _pydantic_fix(e)))
    return out


def _without_auto(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_auto(v) for k, v in data.items() if v != "auto"}
    return data


def _top_level_kinds(key: str) -> tuple[set[str] | None, str]:
    """Expected JSON kinds of a top-level key DeepSpeed reads with a None default (so the default says nothing),
    and why it matters: the example in DeepSpeed's *_FORMAT help, else a number where DeepSpeed computes with it."""
    example = format_examples().get(key)
    kinds = _default_kinds(example) if example is not None else None
    if kinds is None and key in numeric_by_use():
        kinds = {"a number"}
    why = "; DeepSpeed's parser keeps the value as found and fails when it first uses it" if kinds else ""
    return kinds, why


def check_schema(config: dict, target: Target = "deepspeed") -> tuple[list[Problem], list[str], dict[str, Any]]:
    """Problems against DeepSpeed's schema; the key paths holding an "auto" DeepSpeed itself would not accept;
    and among those, the ones DeepSpeed silently drops (top level of a model section), with the default it uses."""
    walk = _Walk(config, target)
    walk.section(config, "")
    optimizer_type = lookup_type(config, "optimizer", optimizer_choices)
    scheduler_type = lookup_type(config, "scheduler", scheduler_choices)
    for found in (optimizer_type, scheduler_type):
        if found:
            walk.add(*found)
    return walk.problems, walk.autos, walk.dropped


def lookup_type(config: dict, section: str, choices) -> tuple | None:
    """The problem with `<section>.type`, if any: missing, not a string, or not something DeepSpeed can build."""
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
    if builds is None and section == "optimizer" and kind.lower() in REMOVED_OPTIMIZERS:
        message = (
            f"the 1-bit optimizer {kind!r} is gone from the installed DeepSpeed {deepspeed_version()} (valid only on"
            " older releases): the parse passes, then deepspeed.initialize fails looking it up in torch.optim"
        )
        return ("error", path, kind, message, 'use "AdamW" or "Lamb", or pin the older DeepSpeed')
    if builds is None:
        return ("error", path, kind, f"DeepSpeed cannot build {section} {kind!r}", did_you_mean(kind, choices()))
    return None

"""DeepSpeed's config schema, learned from DeepSpeed itself (never re-typed by hand).

Most of DeepSpeed's config is *not* a pydantic model: `DeepSpeedConfig` reads the top level and
sections such as `optimizer`, `checkpoint` or `flops_profiler` with `get()`, `in` and `.keys()`,
and silently ignores every key it never asks for. So we run DeepSpeed's own parser over dicts
that record which keys it asks for (and the default it offers, which tells the expected type),
and over section probes that reveal which pydantic model a section is handed to. The result is
cached: one discovery per process, a few hundred milliseconds after `import deepspeed`.

Also here: the "auto" keys that the Hugging Face Trainer fills, learned the same way by running
its `trainer_config_process` / `trainer_config_finalize` against a recording stand-in.

Checking a config against this schema is `lint_schema`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from collections.abc import KeysView
from dataclasses import dataclass, field
from typing import Any


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


def unwrap_model(annotation: Any) -> type | None:
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
                    unwrap_model(type(self).model_fields[name].annotation) if name in type(self).model_fields else None
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
def quiet():
    """DeepSpeed logs warnings while parsing; a linter reports them as Problems instead."""
    import logging

    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def deepspeed_parse(config: dict, world_size: int) -> str | None:
    """Run DeepSpeed's own `DeepSpeedConfig` parse at `world_size`; its error message, or None if it accepts."""
    import_deepspeed()
    from unittest import mock  # here, not at the top: it costs `zero-kit config` ~50 ms (asyncio)

    import deepspeed.runtime.config as ds_config

    with quiet(), mock.patch.object(ds_config, "dist", _FakeDist(world_size)):
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
    from unittest import mock

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

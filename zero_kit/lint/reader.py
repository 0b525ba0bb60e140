"""The one strict reader of DeepSpeed config files, used by `zero-kit validate`, `zero-kit train --ds-config`,
`zero-kit export` and the Python API, so a file is refused the same way wherever it enters.

Strict means: UTF-8, JSON (line and column on a syntax error), no nesting past MAX_DEPTH, and no key given
twice in one object. DeepSpeed refuses duplicate keys when it opens a config path itself, but the HF Trainer and
accelerate parse the file with plain `json.load`, where the LAST value silently wins: a config with two
`zero_optimization.stage` entries would train at a stage nobody chose. Each duplicate is reported with its full
key path and both values.

The one leniency follows DeepSpeed: given a config PATH, DeepSpeed reads it with hjson, which also takes comments,
trailing commas, missing commas at line ends and bare words. So for the consumer "deepspeed" such a file is read
with hjson (a warning says other readers refuse it); the HF Trainer and accelerate read the file with strict
`json.load`, so for them it stays unreadable, and the message says that plain deepspeed would read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zero_kit.lint.problem import ROOT, Problem, Target, join

MAX_DEPTH = 100
"""Deeper nesting than any DeepSpeed config has; refused before Python's JSON parser hits its recursion limit."""


class Unreadable(Exception):
    """A file that is missing or not JSON: message plus line/column when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, syntax: str = "") -> None:
        super().__init__(message)
        self.line, self.column = line, column
        self.syntax = syntax
        """The JSON parser's own complaint when the file was read but is not JSON (empty otherwise)."""

    def where(self, path: str) -> str:
        return f"{path}:{self.line}:{self.column}" if self.line else path


class _Object(dict):
    """A parsed JSON object that remembers the keys given twice, as (key, first value, last value)."""

    twice: list[tuple[str, Any, Any]]


def _remember_duplicates(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.twice = []
    for key, value in pairs:
        if key in obj:
            obj.twice.append((key, obj[key], value))
        obj[key] = value
    return obj


def _plain(node: Any, path: str, found: list[Problem]) -> Any:
    """Plain dicts and lists again, collecting one Problem per duplicate key with its full path."""
    if isinstance(node, _Object):
        for key, first, last in node.twice:
            values = [_plain(first, "", []), _plain(last, "", [])]
            found.append(
                Problem(
                    "error",
                    join(path, key),
                    values,
                    f"key appears twice in one object (first {_short(values[0])}, then {_short(values[1])}); DeepSpeed"
                    " refuses the file, while the HF Trainer and accelerate silently keep the last value",
                    "keep one of the two entries",
                )
            )
        return {key: _plain(value, join(path, key), found) for key, value in node.items()}
    if isinstance(node, list):
        return [_plain(item, join(path, index), found) for index, item in enumerate(node)]
    return node


def _short(value: Any) -> str:
    text = json.dumps(value, allow_nan=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _too_deep(text: str) -> int | None:
    """Offset where brackets nest deeper than MAX_DEPTH (strings skipped), or None."""
    depth, in_string, escaped = 0, False, False
    for offset, char in enumerate(text):
        if in_string:
            escaped, in_string = (not escaped and char == "\\"), in_string and (escaped or char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return offset
        elif char in "]}":
            depth -= 1
    return None


def _text(path: str | Path) -> str:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise Unreadable("no such file") from None
    except IsADirectoryError:
        raise Unreadable("is a directory, not a file") from None
    except OSError as err:
        raise Unreadable(f"cannot read: {err.strerror or err}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        before = raw[: err.start].decode("utf-8", "replace")
        raise Unreadable("not UTF-8 text (save the file as UTF-8)", *_line_col(before, len(before))) from None


def read_config(path: str | Path, consumer: Target = "deepspeed") -> tuple[Any, list[Problem]]:
    """The parsed config and one error Problem per key given twice (plus a warning when only hjson reads it, see
    the module docstring). `consumer` is who reads the file at run time. Raises Unreadable for what cannot be parsed."""
    text = _text(path)
    deep = _too_deep(text)
    if deep is not None:
        deeper = f"nested deeper than {MAX_DEPTH} levels"
        raise Unreadable(f"invalid JSON: {deeper}", *_line_col(text, deep), syntax=deeper)
    found: list[Problem] = []
    try:
        parsed = json.loads(text, object_pairs_hook=_remember_duplicates)
    except json.JSONDecodeError as err:
        parsed = _hjson_or_raise(text, err, consumer)
        found.append(_only_hjson_reads_it(err))
    return _plain(parsed, "", found), found


def _hjson_or_raise(text: str, err: json.JSONDecodeError, consumer: Target) -> Any:
    """The config as DeepSpeed's hjson reader sees it, when the consumer is plain deepspeed; Unreadable otherwise."""
    import hjson  # a DeepSpeed dependency; imported only for files that are not JSON

    where = f"invalid JSON: {err.msg}"
    try:
        parsed = hjson.loads(text, object_pairs_hook=_remember_duplicates)
    except (hjson.HjsonDecodeError, RecursionError, ValueError):
        raise Unreadable(where, err.lineno, err.colno, syntax=err.msg) from None
    if not isinstance(parsed, dict):
        raise Unreadable(where, err.lineno, err.colno, syntax=err.msg)  # hjson reads any text as a string
    if consumer != "deepspeed":
        why = (
            f"{where} ({consumer} reads the file with strict json.load; hjson would accept it, so plain deepspeed"
            " given the path would read it)"
        )
        raise Unreadable(why, err.lineno, err.colno, syntax=err.msg)
    return parsed


def _only_hjson_reads_it(err: json.JSONDecodeError) -> Problem:
    message = (
        f"not strict JSON ({err.msg} at line {err.lineno}, column {err.colno}): DeepSpeed reads a config path with"
        " hjson and accepts it, but the HF Trainer, accelerate, json.load and most tools refuse the file"
    )
    return Problem("warning", ROOT, f"line {err.lineno}:{err.colno}", message, "fix the JSON syntax at that place")

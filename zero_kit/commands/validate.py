"""`zero-kit validate FILE...`: lint DeepSpeed JSON configs before launch.

Exit 0: no errors (warnings may print); 1: errors; 2: unreadable input (missing file, invalid JSON).
The world size comes from --world-size, else WORLD_SIZE / SLURM_NTASKS / OMPI_COMM_WORLD_SIZE.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from zero_kit.errors import UserError
from zero_kit.options import add_dataclass_arguments

WORLD_SIZE_ENV = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2


@dataclass(frozen=True)
class ValidateOptions:
    world_size: int | None = None
    """Data-parallel ranks the config will run at. Default: WORLD_SIZE, SLURM_NTASKS or OMPI_COMM_WORLD_SIZE."""
    json: bool = False
    """Print the problems as a JSON list (each with file, severity, path, value, message, fix)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="DeepSpeed JSON config(s) to check")
    parser.add_argument(
        "--for",
        dest="target",
        choices=("deepspeed", "hf-trainer", "accelerate"),
        default="deepspeed",
        help='who launches the config: plain deepspeed.initialize (no "auto"), the HF Trainer, or accelerate launch',
    )
    add_dataclass_arguments(parser, ValidateOptions)


def world_size_from(flag: int | None, environ: dict[str, str]) -> tuple[int | None, str]:
    """The world size and where it came from: the flag first, then the launcher's environment."""
    if flag is not None:
        if flag < 1:
            raise UserError(f"--world-size must be >= 1, got {flag}", "pass the number of data-parallel ranks")
        return flag, "--world-size"
    for name in WORLD_SIZE_ENV:
        raw = environ.get(name, "").strip()
        if raw:
            if not raw.isdigit() or int(raw) < 1:
                raise UserError(f"{name}={raw!r} is not a positive integer", f"unset {name} or pass --world-size N")
            return int(raw), name
    return None, ""


class Unreadable(Exception):
    """A file that is missing or not JSON: message plus line/column when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line, self.column = line, column


def _no_duplicates(duplicates: list[str]):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    return hook


MAX_DEPTH = 100
"""Deeper nesting than any DeepSpeed config has; refused before Python's JSON parser hits its recursion limit."""


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


def read_config(path: str) -> tuple[Any, list[str]]:
    """The parsed JSON and the keys that appeared twice in one object (DeepSpeed refuses those)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise Unreadable("no such file") from None
    except OSError as err:
        raise Unreadable(f"cannot read: {err.strerror or err}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        before = raw[: err.start].decode("utf-8", "replace")
        line, column = _line_col(before, len(before))
        raise Unreadable("not UTF-8 text (save the file as UTF-8)", line, column) from None
    deep = _too_deep(text)
    if deep is not None:
        raise Unreadable(f"invalid JSON: nested deeper than {MAX_DEPTH} levels", *_line_col(text, deep))
    duplicates: list[str] = []
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(duplicates)), duplicates
    except json.JSONDecodeError as err:
        raise Unreadable(f"invalid JSON: {err.msg}", err.lineno, err.colno) from None


def _lint_file(path: str, context) -> list[dict[str, Any]]:
    from zero_kit.lint.core import Problem, lint

    config, duplicates = read_config(path)
    problems = [
        Problem(
            "error", key, None, f"key {key!r} appears twice in one object; DeepSpeed refuses duplicates", "keep one"
        )
        for key in duplicates
    ]
    problems += lint(config, context)
    return [{"file": path, **p.to_dict()} for p in problems]


def _print_text(path: str, problems: list[dict[str, Any]]) -> None:
    from zero_kit.lint.core import Problem

    errors = sum(p["severity"] == "error" for p in problems)
    warnings = len(problems) - errors
    print(f"{path}: {'OK' if not errors else 'FAILED'} ({errors} error(s), {warnings} warning(s))")
    for item in problems:
        fields = {k: v for k, v in item.items() if k != "file"}
        print("  " + str(Problem(**fields)).replace("\n", "\n  "))


def _json_safe(value: Any) -> Any:
    """NaN/Infinity are not JSON: show them as strings in --json output."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return [_json_safe(v) for v in value] if isinstance(value, list) else value


def run(args: argparse.Namespace) -> int:
    from zero_kit.lint.core import LintContext

    world_size, source = world_size_from(args.world_size, dict(os.environ))
    context = LintContext(world_size=world_size, world_size_source=source, target=args.target)
    everything: list[dict[str, Any]] = []
    worst = EXIT_OK
    for path in args.files:
        try:
            problems = _lint_file(path, context)
        except Unreadable as err:
            where = f":{err.line}:{err.column}" if err.line else ""
            print(f"zero-kit validate: error: {path}{where}: {err}", file=sys.stderr)
            everything.append(
                {"file": path, "severity": "error", "line": err.line, "column": err.column, "message": str(err)}
            )
            worst = EXIT_UNREADABLE
            continue
        if any(p["severity"] == "error" for p in problems):
            worst = max(worst, EXIT_ERRORS)
        everything += problems
        if not args.json:
            _print_text(path, problems)
    if args.json:
        print(json.dumps(_json_safe(everything), indent=2, default=str))
    return worst

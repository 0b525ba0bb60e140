"""Dataclass fields as command-line options: one source of truth per option.

Each option is a dataclass field with a docstring right under it (torchtitan's `job_config.py`
style). `add_dataclass_arguments` turns those fields into argparse flags whose `--help` text is
that docstring, so CLI, JSON and docs come from the same place.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import types
import typing
from functools import cache

PORTS = range(1, 65536)
"""TCP ports a rendezvous can use (0 means "any" to the OS and is no port to meet on)."""


class PortError(argparse.ArgumentTypeError, ValueError):
    """A --master-port out of range: argparse says the message; a run file's reader (a ValueError) says it too."""


def port(text: str) -> int:
    """argparse type of a TCP port (every --master-port): out of 1..65535 it is refused where the flag is parsed,
    before any command creates a directory or asks the OS to bind it (which raises OverflowError)."""
    try:
        value = int(text)
    except ValueError:
        raise PortError(f"{text!r} is not a port number: pass a TCP port, 1..65535") from None
    if value not in PORTS:
        raise PortError(f"{value} is out of range: a TCP port is 1..65535")
    return value


Port = typing.Annotated[int, port]
"""A dataclass field of this type becomes a flag parsed by `port`."""


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal right under a field) of a dataclass, by field name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(inspect.getsource(klass))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _base_type(annotation: typing.Any) -> typing.Any:
    """`int | None` -> int; `Literal[...]` and `Annotated[int, parse]` (Port) stay."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return annotation


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()) -> None:
    """Add one `--flag-name` per field of `cls`; defaults are the dataclass defaults. The help is the field's
    docstring: read now, or, on a parser with a `field_help` list (zero_kit.cli.Parser), when it prints its help."""
    lazy = getattr(parser, "field_help", None)
    docs = {} if lazy is not None else field_docs(cls)
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = docs.get(f.name, "")
        if default not in (None, False):
            help_text += f" (default: {default})"
        kind = _base_type(hints[f.name])
        if typing.get_origin(kind) is typing.Annotated:  # Annotated[int, port]: the callable parses the flag
            kind = typing.get_args(kind)[1]
        if kind is bool:
            action = parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
        elif typing.get_origin(kind) is typing.Literal:
            choices = typing.get_args(kind)
            action = parser.add_argument(
                flag, dest=f.name, choices=choices, type=type(choices[0]), default=default, help=help_text
            )
        else:
            action = parser.add_argument(
                flag, dest=f.name, type=kind, default=default, metavar=f.name.upper(), help=help_text
            )
        if lazy is not None:
            lazy.append((action, cls, f.name))


def dataclass_from_args(cls: type, args: argparse.Namespace, **overrides: typing.Any):
    """Build `cls` from the parsed flags that match its fields (plus explicit overrides)."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    values.update(overrides)
    return cls(**values)


def options_to_argv(opts: typing.Any, *, drop: tuple[str, ...] = ()) -> list[str]:
    """The flags that reproduce the dataclass `opts` (only non-default values), e.g. for a re-launch."""
    argv: list[str] = []
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if f.name in drop or value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv

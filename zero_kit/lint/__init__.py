"""Lint DeepSpeed configs before launch: the strict reader (`read_config`), the rules (`lint`; the rule book alone,
without DeepSpeed, is `check_rules`, which the config generator runs on its own output), and
`load_checked`, which every entry point that takes a config file from a user goes through (`zero-kit bench
--ds-config` through its two halves, `read_checked` and `refuse_errors`, with its own checks between them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zero_kit.errors import UserError
from zero_kit.lint.core import check_rules, lint
from zero_kit.lint.problem import LintContext, Problem, Target
from zero_kit.lint.reader import Unreadable, read_config

__all__ = [
    "LintContext",
    "Problem",
    "Target",
    "Unreadable",
    "check_rules",
    "lint",
    "lint_file",
    "load_checked",
    "read_checked",
    "read_config",
    "refuse_errors",
]


def lint_file(path: str | Path, context: LintContext) -> tuple[Any, list[Problem]]:
    """The config in `path` and every problem in it: duplicate keys first, then the rules. Raises Unreadable.
    The file is read the way `context.target` reads it (plain deepspeed also takes hjson)."""
    config, problems = read_config(path, context.target)
    return config, problems + lint(config, context)


def read_checked(path: str | Path, target: Target, flag: str) -> tuple[Any, list[Problem]]:
    """The config in `path`, read as `target` reads it, and the reader's own problems (duplicate keys, hjson); a
    UserError naming `flag` and the file (line and column for a syntax error) when it cannot be read."""
    try:
        return read_config(path, target)
    except Unreadable as err:
        where = err.where(str(path))
        if err.syntax:
            fix = f"check it with `zero-kit validate {path}`"
            detail = str(err).removeprefix("invalid JSON: ")  # keeps the note on hjson where there is one
            raise UserError(f"{flag} {where}: not valid JSON ({detail})", fix) from None
        raise UserError(f"{flag} {where}: cannot read it ({err})", "give an existing UTF-8 JSON file") from None


def refuse_errors(path: str | Path, problems: list[Problem], target: Target, flag: str) -> None:
    """A UserError listing every error of `problems` exactly as `zero-kit validate` does (warnings pass)."""
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        lines = "\n".join("  " + str(p).replace("\n", "\n  ") for p in errors)
        raise UserError(
            f"{flag} {path} has {len(errors)} error(s) for {target}:\n{lines}",
            f"fix them (zero-kit validate {path} --for {target} shows them with warnings too)",
        )


def load_checked(path: str | Path, context: LintContext, flag: str) -> dict:
    """The config in `path` for a run, or a UserError listing every error exactly as `zero-kit validate` does
    (warnings pass). `flag` names where the path came from, e.g. "--ds-config"."""
    config, problems = read_checked(path, context.target, flag)
    refuse_errors(path, problems + lint(config, context), context.target, flag)
    return config

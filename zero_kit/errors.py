"""Errors a user can cause. Library code raises these; only the CLI edge prints them and picks exit codes."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user gave us: names the flag, key, file or line, and says how to fix it."""

    exit_code = 2

    def __init__(self, message: str, fix: str = "", *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class BatchSizeError(UserError):
    """The batch triple (micro batch, gradient accumulation, global batch) cannot hold at this world size."""


def raise_all(problems: list[UserError], when: str) -> None:
    """Report every problem at once, each with its own fix (a user fixes five mistakes in one round, not five).
    `when` says where they were found, e.g. "before training"."""
    if not problems:
        return
    if len(problems) == 1:
        raise problems[0]
    lines = [f"{len(problems)} problems {when}:"]
    lines += [f"  - {p.message}\n    fix: {p.fix}" if p.fix else f"  - {p.message}" for p in problems]
    raise UserError("\n".join(lines), "fix each problem above")

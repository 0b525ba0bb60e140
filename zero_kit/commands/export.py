"""`zero-kit export` (not built yet: see the open issue)."""

from __future__ import annotations

import argparse

from zero_kit.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER)


def run(args: argparse.Namespace) -> int:
    raise UserError("zero-kit export is not available in this version yet")

"""`zero-kit ops build`: build DeepSpeed's ops that runs on this machine load, ahead of time (a cluster image, a login
node), into the directory `zero-kit train` and `zero-kit bench` use; `zero-kit ops where` prints that directory.

    zero-kit ops build                       # CPU: shm all-reduce, fused Adam, CPU Adam; GPU: fused Adam, CPU Adam
    zero-kit ops build --op CPUAdamBuilder   # one op (a DeepSpeed op builder class name)
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("build", "where"), help="build the ops, or print where they build")
    parser.add_argument(
        "--op",
        action="append",
        metavar="BUILDER",
        help="a DeepSpeed op builder class, e.g. CPUAdamBuilder (repeatable; default: what this machine's runs load)",
    )


def run(args: argparse.Namespace) -> int:
    from zero_kit.launch.ops import build_ops, default_ops, use_extensions_dir

    where = use_extensions_dir()
    if args.action == "where":
        print(where)
        return 0
    for name, seconds in build_ops(tuple(args.op or default_ops())):
        print(f"zero-kit ops: {name} ready in {seconds:.0f} s ({where})", file=sys.stderr)
    return 0

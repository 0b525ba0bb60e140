"""DeepSpeed's CPU ops for the launcher tiers, built once per test run before any launcher test's timeout starts.

DeepSpeed compiles them on first use (shm all-reduce, fused Adam, CPU Adam for offload; 1-2 min each on 2 cores)
into the private TORCH_EXTENSIONS_DIR (tests/rigs/base.private_extensions_dir, cached per torch/DeepSpeed
pair and venv). `python -m scripts.test_tiers` starts the build in the background while ruff and the unit tier run,
waits for it before the first launcher test and sets READY in every later pytest's environment: then neither the
collection hook (tests/conftest.py) nor a multinode module (`cpu_ops`) checks the cache again (a cache hit costs a
process that imports DeepSpeed, ~6 s, once per xdist worker and module otherwise).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

READY = "ZERO_KIT_TEST_OPS_READY"
# ZERO_KIT_TEST_OPS narrows the list for a run that needs fewer: CI's compatibility slice trains with torch's AdamW,
# no optimizer offload and zero-kit's ranks (which mark the shm op unused), so none (set and empty); any other op
# would still be built by DeepSpeed on first use.
SELECT = "ZERO_KIT_TEST_OPS"
DEFAULT_OPS = "ShareMemCommBuilder,FusedAdamBuilder,CPUAdamBuilder"


def op_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (this process's environment) with the private TORCH_EXTENSIONS_DIR and this venv's bin first on PATH:
    the ops are built by this environment's ninja (with another ninja first, each rebuilds the other's builds)."""
    from tests.rigs.base import private_extensions_dir

    env = dict(os.environ if base is None else base)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(private_extensions_dir()))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def selected() -> list[str]:
    """The ops this run builds: ZERO_KIT_TEST_OPS's (set and empty: none), else DEFAULT_OPS."""
    return [name.strip() for name in os.environ.get(SELECT, DEFAULT_OPS).split(",") if name.strip()]


def build_argv() -> list[str]:
    """The command that builds (or finds cached) every op of ZERO_KIT_TEST_OPS."""
    names = selected()
    code = f"from deepspeed.ops.op_builder import {', '.join(names)}\nfor b in ({', '.join(names)},): b().load(verbose=False)\n"
    return [sys.executable, "-c", code]


def ready() -> bool:
    """True when this test run already built the ops (scripts/test_tiers.py says so through READY)."""
    return os.environ.get(READY) == "1"


def build(timeout: float = 1800) -> float | None:
    """Build the ops now unless this run already did; the seconds it took, or None when nothing had to be done."""
    if ready() or not selected():
        return None
    from tests.rigs.base import clear_stale_build_lock

    clear_stale_build_lock()
    start = time.monotonic()
    subprocess.run(build_argv(), check=True, capture_output=True, timeout=timeout, env=op_env())
    os.environ[READY] = "1"  # this process's later checks (the multinode `cpu_ops` fixture) and its children know
    return time.monotonic() - start

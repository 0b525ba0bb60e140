"""Fixtures every multinode test module shares."""

from __future__ import annotations

import pytest

from benchmarks.rigs.base import build_cpu_ops


@pytest.fixture(scope="module")
def cpu_ops() -> float:
    """DeepSpeed's shm op built once into the private TORCH_EXTENSIONS_DIR, outside any launcher's timeout."""
    took = build_cpu_ops(timeout=900)
    print(f"\n[rig timing] DeepSpeed CPU op build/cache check: {took:.1f} s")
    return took

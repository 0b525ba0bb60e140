"""Fixtures every multinode test module shares."""

from __future__ import annotations

import pytest
from bench_reference import single_node_losses

from tests.rigs.base import build_cpu_ops
from tests.support import ops


@pytest.fixture(scope="session")
def cpu_ops() -> float:
    """DeepSpeed's shm op built into the private TORCH_EXTENSIONS_DIR, outside any launcher's timeout: once per
    pytest process, and not at all when this test run built the ops before its first launcher test."""
    if ops.ready():
        return 0.0
    took = build_cpu_ops(timeout=900)
    print(f"\n[rig timing] DeepSpeed CPU op build/cache check: {took:.1f} s")
    return took


@pytest.fixture(scope="session")
def single_node(tmp_path_factory, cpu_ops) -> dict[str, list[float]]:
    """Losses of the one-host two-rank DDP run at the two-host bench size (bench_reference.py)."""
    return single_node_losses(tmp_path_factory)

"""The size of the two-host bench runs (test_two_hosts.py, test_cluster_bench.py) and their one-host reference: the
losses of one two-rank DDP run on this host, trained once per test run (tests/support/shared.py). Every two-host run
at this size, of any strategy, must equal DDP's within 1e-5 (fp32); tests/dist/test_bench_compile.py compares its
compiled runs with the first steps of the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.shared import shared_run
from zero_kit.bench import BenchOptions, run_bench

SIZE = {"hidden_size": 96, "layers": 2, "vocab_size": 256, "seq_len": 32, "micro_batch": 2, "steps": 6, "warmup": 1}
STRATEGIES = "ddp"


def size_flags() -> list[str]:
    """SIZE as `zero-kit bench` flags."""
    return [item for key, value in SIZE.items() for item in (f"--{key.replace('_', '-')}", str(value))]


def single_node_losses(factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    def train(directory: Path) -> None:
        opts = BenchOptions(strategies=STRATEGIES, nproc=2, master_port=29880, timeout=300, out=str(directory), **SIZE)
        records = run_bench(opts)
        assert not any(r.get("failed") for r in records), [r.get("log_tail") for r in records]
        (directory / "losses.json").write_text(json.dumps({r["strategy"]: r["losses"] for r in records}))

    return json.loads((shared_run(factory, "bench_single_node", train) / "losses.json").read_text())

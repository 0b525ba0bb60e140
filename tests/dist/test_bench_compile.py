"""`zero-kit bench --compile`: torch.compile on every backend family (DDP, FSDP2, DeepSpeed ZeRO via
`engine.compile()`), real launches on 2 CPU ranks. Compiled graphs must really be captured, and the compiled
losses must stay with the eager DDP losses: those of the one-host DDP reference run at the same size
(tests/multinode/bench_reference.py, trained once per test run for the two-host tests), its first steps. Ports
29750-29759."""

from __future__ import annotations

import json

import pytest

from tests.multinode.bench_reference import SIZE, single_node_losses
from zero_kit.bench import BenchOptions, run_bench

pytestmark = pytest.mark.dist
STEPS = 4
# the reference's model, data and batch (its warm-up steps only decide which steps are timed)
SMALL = dict(SIZE, nproc=2, steps=STEPS, warmup=2)


def _bench(out, strategies: str, port: int, compile: bool) -> dict[str, dict]:
    opts = BenchOptions(strategies=strategies, out=str(out), master_port=port, compile=compile, timeout=400, **SMALL)
    run_bench(opts, progress=lambda line: None)
    return {r["strategy"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_compiled_strategies_capture_graphs_and_match_eager_losses(tmp_path, tmp_path_factory):
    compiled = _bench(tmp_path / "compiled", "ddp,fsdp,zero3", 29750, compile=True)
    reference = single_node_losses(tmp_path_factory)["ddp"][:STEPS]
    for name, record in compiled.items():
        assert not record.get("failed"), "\n".join(record.get("log_tail", []))
        assert record["compiled_graphs"] >= 1, f"{name}: torch.compile captured no graph (fell back to eager)"
        # CPU ranks compile in the rank, not in a worker pool whose exit can wait 300 s after a cold compile
        assert record["compile_threads"] == 1, f"{name}: Inductor compile threads {record['compile_threads']}"
        diff = max(abs(a - b) for a, b in zip(record["losses"], reference, strict=True))
        # inductor fuses and reorders float arithmetic: close to eager, not bitwise
        assert diff <= 1e-4, f"{name} compiled differs from eager DDP by {diff}"

"""The accounting at four ranks (issue 4 asks two and four): real launches of a tiny LLaMA on 4 CPU ranks
(torchrun for ddp/fsdp, the deepspeed launcher for ZeRO), a few steps only: bytes do not depend on the step
count. Measured per-rank model-state bytes against the formula, the planner, and collective bytes against DDP.
Ports 29740-29749."""

from __future__ import annotations

import json

import pytest

from zero_kit.plan.accounting import model_state_bytes, zero12_edge_grad_bytes
from zero_kit.bench import BenchOptions, run_bench

pytestmark = pytest.mark.dist
STRATEGIES = ["ddp", "fsdp", "zero1", "zero2", "zero3_release"]
N = 4
# fp32 AdamW bytes per parameter as (replicated, partitioned over N); see test_bench_compare.py for the storages.
FP32_COEFFICIENTS = {"ddp": (16, 0), "fsdp": (0, 16), "zero1": (4, 16), "zero2": (4, 16), "zero3_release": (0, 20)}
PLANNER_NAME = {"zero3_release": "zero3"}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench4")
    opts = BenchOptions(strategies=",".join(STRATEGIES), nproc=N, hidden_size=96, layers=2, vocab_size=256,
                        seq_len=32, micro_batch=1, grad_accum=1, steps=4, warmup=1, out=str(out),
                        master_port=29740, timeout=300)  # fmt: skip
    run_bench(opts, progress=lambda line: None)
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {r["strategy"]: r for r in results}


def test_every_strategy_ran_on_four_ranks(records):
    assert sorted(records) == sorted(STRATEGIES)
    for r in records.values():
        assert not r.get("failed"), r.get("log_tail")
        assert r["world_size"] == N and len(r["losses"]) == 4
        assert len(r["model_state_bytes_per_rank"]["all_ranks"]) == N


@pytest.mark.parametrize("name", STRATEGIES)
def test_measured_state_bytes_match_accounting_within_1_percent_at_4_ranks(records, name):
    state = records[name]["model_state_bytes_per_rank"]
    n, numels = records[name]["model"]["n_params"], records[name]["model"]["param_numels"]
    replicated, partitioned = FP32_COEFFICIENTS[name]
    planned = model_state_bytes(PLANNER_NAME.get(name, name), n, N, "fp32")
    assert planned.total == replicated * n + partitioned * n // N
    # ZeRO-1/2: each rank also keeps whole the gradients of the parameters at its partition's edges
    edges = zero12_edge_grad_bytes(numels, N, "fp32") if name in ("zero1", "zero2") else [0] * N
    assert state["predicted"]["all_ranks_total"] == [planned.total + e for e in edges]
    for rank, rank_state in enumerate(state["all_ranks"]):
        expected = planned.total + edges[rank]
        assert rank_state["total"] == pytest.approx(expected, rel=0.01), (name, rank, planned.formula, rank_state)
    assert abs(state["error_vs_predicted"]) < 0.01


def test_edge_gradients_are_why_the_papers_zero12_formula_is_off_at_4_ranks(records):
    # This model's parameters are large next to Ψ/N (Ψ/4 ≈ 98k elements, the embedding 24.6k): without the edge
    # term the ZeRO-1/2 rows miss by more than 1% on some rank; with it (above) every rank is within 1%.
    n, numels = records["zero2"]["model"]["n_params"], records["zero2"]["model"]["param_numels"]
    paper = model_state_bytes("zero2", n, N, "fp32").total
    measured = [rank["total"] for rank in records["zero2"]["model_state_bytes_per_rank"]["all_ranks"]]
    assert max(abs(m / paper - 1) for m in measured) > 0.01
    # and the edge term is exactly the gradient excess DeepSpeed allocated
    grads = [rank["grads"] for rank in records["zero2"]["model_state_bytes_per_rank"]["all_ranks"]]
    share = 4 * -(-n // N)
    assert [g - share for g in grads] == zero12_edge_grad_bytes(numels, N, "fp32")


def test_comm_bytes_ratios_against_ddp_at_4_ranks(records):
    ring = {n: r["comm_bytes_per_step"]["ring_bytes_sent_per_rank"] for n, r in records.items()}
    psi = records["ddp"]["model"]["n_params"] * 4
    assert ring["ddp"] == pytest.approx(2 * (N - 1) / N * psi, rel=0.01)  # one ring all-reduce of every gradient
    assert ring["zero1"] / ring["ddp"] == pytest.approx(1.5, abs=0.05)  # bucket all-reduce + partition all-gather
    assert ring["zero2"] / ring["ddp"] == pytest.approx(1.5, abs=0.05)
    assert ring["zero3_release"] / ring["ddp"] == pytest.approx(1.5, abs=0.05)  # the paper's 3Ψ
    # FSDP2 gathers each block twice and the root (embeddings, lm_head, final norm; not resharded) once:
    # 1 + 0.5 x (the blocks' share of the parameters), strictly between 1.0 and 1.5.
    assert 1.05 < ring["fsdp"] / ring["ddp"] < 1.5

"""Four CPU ranks counted as 2 nodes of 2 on one host (`--gpus-per-node 2` below `--nproc 4`: the link tiers and
the node-aware strategies take rank // 2 as the node), one launch per strategy for two studies:

- Issue 12, the node-aware strategies: fp32 loss parity with DDP, measured per-rank state bytes against the
  planner's byte tables (within 1%), and the measured ring bytes per link tier against `zero_kit.plan.traffic`
  (within 1%), the formulas `zero-kit plan` ranks by. Here: FSDP2's reshard-to-node and ZeRO-3 with bf16 states.
  hpZ (zero3_hpz_release against zero3_release) and HSDP (fsdp_hsdp against fsdp) get the same checks on their runs
  across two real hosts (tests/multinode/test_hierarchy_link_cap.py), where they are launched anyway.
- Issue 4, the accounting at four ranks (it asks two and four; two: test_bench_compare.py): the flat strategies'
  per-rank model-state bytes against the formula, ZeRO-2's edge gradients (ZeRO-1 keeps the same gradients and
  states: at two ranks both run), collective bytes against DDP; ZeRO-3's at four ranks is the two-host module's.
  The node count changes none of these: bytes do not depend on where a rank is, only the tiers do.

Ports 29770-29779."""

from __future__ import annotations

import json

import pytest

from zero_kit.bench import BenchOptions, run_bench
from zero_kit.bench.report import PARITY_TOL
from zero_kit.plan.accounting import model_state_bytes, zero12_edge_grad_bytes

pytestmark = pytest.mark.dist
N, PER_NODE = 4, 2
FLAT = ["ddp", "fsdp", "zero2"]
STRATEGIES = [*FLAT, "fsdp_reshard_node", "zero3_bf16states"]
SAME_ARITHMETIC = [name for name in STRATEGIES if name not in ("ddp", "zero3_bf16states")]
# fp32 AdamW bytes per parameter as (replicated, partitioned over N); see test_bench_compare.py for the storages.
FP32_COEFFICIENTS = {"ddp": (16, 0), "fsdp": (0, 16), "zero2": (4, 16)}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_nodes")
    opts = BenchOptions(strategies=",".join(STRATEGIES), nproc=N, gpus_per_node=PER_NODE, hidden_size=96, layers=2,
                        vocab_size=256, seq_len=32, micro_batch=1, grad_accum=1, steps=8, warmup=1, out=str(out),
                        master_port=29770, timeout=300)  # fmt: skip
    run_bench(opts, progress=lambda line: None)
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert "Not DDP's arithmetic" in (out / "table.md").read_text()
    return {r["strategy"]: r for r in results}


def test_every_strategy_ran_as_two_nodes_of_two(records):
    assert sorted(records) == sorted(STRATEGIES)
    for r in records.values():
        assert not r.get("failed"), r.get("log_tail")
        assert (r["world_size"], r["nnodes"], r["ranks_per_node"]) == (N, 2, PER_NODE)
        assert r["comm_bytes_per_step"]["ranks_per_node"] == PER_NODE


@pytest.mark.parametrize("name", SAME_ARITHMETIC)
def test_fp32_losses_match_ddp_within_1e_5(records, name):
    ddp = records["ddp"]["losses"]
    diff = max(abs(a - b) for a, b in zip(records[name]["losses"], ddp, strict=True))
    assert diff <= PARITY_TOL, f"{name} differs from ddp by {diff}"
    assert records[name]["loss_parity"] is True and records[name]["same_arithmetic_as_ddp"] is True


def test_bf16_states_are_not_ddps_arithmetic_and_say_so(records):
    r = records["zero3_bf16states"]
    assert r["same_arithmetic_as_ddp"] is False
    # bf16 autocast and bf16 master/moments: off DDP's fp32 losses from the first step, but still training
    assert PARITY_TOL < r["max_abs_loss_diff_vs_ddp"] < 0.05
    assert r["losses"][-1] < r["losses"][0]


@pytest.mark.parametrize("name", STRATEGIES)
def test_measured_state_bytes_match_the_planner_within_1_percent(records, name):
    state = records[name]["model_state_bytes_per_rank"]
    assert "error" not in state["predicted"], state["predicted"]
    for rank_state, expected in zip(state["all_ranks"], state["predicted"]["all_ranks_total"], strict=True):
        assert rank_state["total"] == pytest.approx(expected, rel=0.01), (name, state["predicted"]["formula"])


def test_hierarchical_state_bytes_by_formula(records):
    n = records["ddp"]["model"]["n_params"]
    total = {name: records[name]["model_state_bytes_per_rank"]["total"] for name in records}
    assert total["fsdp_reshard_node"] == pytest.approx(16 * n / N, rel=0.01)
    assert total["zero3_bf16states"] == pytest.approx(10 * n / N, rel=0.01)  # 2 + 2 + 2 + 4 bytes, all bf16


@pytest.mark.parametrize("name", STRATEGIES)
def test_measured_bytes_per_link_tier_match_the_planners_traffic_within_1_percent(records, name):
    comm = records[name]["comm_bytes_per_step"]
    predicted = comm["predicted"]["all_ranks_by_tier"]
    for tier in ("intra_node", "inter_node"):
        assert comm["ring_bytes_sent_all_ranks_by_tier"][tier] == pytest.approx(predicted[tier], rel=0.01), (name, tier)


def test_node_aware_strategies_cut_inter_node_bytes_by_the_planned_amount(records):
    def inter(name, key="ring_bytes_sent_all_ranks_by_tier"):
        comm = records[name]["comm_bytes_per_step"]
        return (comm["predicted"]["all_ranks_by_tier"] if key == "predicted" else comm[key])["inter_node"]

    for hierarchical, flat in (("fsdp_reshard_node", "fsdp"),):
        planned_cut = inter(flat, "predicted") - inter(hierarchical, "predicted")
        assert planned_cut > 0.2 * inter(flat, "predicted")
        assert inter(flat) - inter(hierarchical) == pytest.approx(planned_cut, rel=0.05), hierarchical


@pytest.mark.parametrize("name", FLAT)
def test_measured_state_bytes_match_accounting_within_1_percent_at_4_ranks(records, name):
    state = records[name]["model_state_bytes_per_rank"]
    n, numels = records[name]["model"]["n_params"], records[name]["model"]["param_numels"]
    replicated, partitioned = FP32_COEFFICIENTS[name]
    planned = model_state_bytes(name, n, N, "fp32")
    assert planned.total == replicated * n + partitioned * n // N
    # ZeRO-2 (and ZeRO-1): each rank also keeps whole the gradients of the parameters at its partition's edges
    edges = zero12_edge_grad_bytes(numels, N, "fp32") if name == "zero2" else [0] * N
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
    assert ring["zero2"] / ring["ddp"] == pytest.approx(1.5, abs=0.05)  # bucket reduce + partition all-gather
    # FSDP2 gathers each block twice and the root (embeddings, lm_head, final norm; not resharded) once:
    # 1 + 0.5 x (the blocks' share of the parameters), strictly between 1.0 and 1.5.
    assert 1.05 < ring["fsdp"] / ring["ddp"] < 1.5

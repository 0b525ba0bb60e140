"""The pipeline with data parallelism: pp on 4 CPU ranks counted as 2 simulated nodes of 2 (--gpus-per-node 2),
PP2 x DP2 with the stages outermost (the planner's rank order): each stage's DDP all-reduce stays inside its node
and only the activations and their gradients cross nodes. Against ddp on the same 4 ranks and global batch: fp32
loss parity and the bytes per link tier, measured and as zero_kit.plan.parallel predicts them. Ports 29850-29859."""

from __future__ import annotations

import json

import pytest

from zero_kit.bench import BenchOptions, run_bench

pytestmark = pytest.mark.dist
N, PER_NODE, ACCUM, MICRO, SEQ, FP32 = 4, 2, 2, 2, 48, 4


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_pp4")
    opts = BenchOptions(strategies="ddp,pp", nproc=N, gpus_per_node=PER_NODE, hidden_size=96, layers=2,
                        vocab_size=256, seq_len=SEQ, micro_batch=MICRO, grad_accum=ACCUM, steps=4, warmup=1,
                        out=str(out), master_port=29850, timeout=240)  # fmt: skip
    run_bench(opts, progress=lambda line: None)
    return {r["strategy"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_pp_with_data_parallel_stages_matches_ddp(records):
    for r in records.values():
        assert not r.get("failed"), r.get("log_tail")
    pp = records["pp"]
    assert pp["parallel"] == {"tensor": 1, "pipeline": 2, "sequence": 1, "data": 2} and pp["nnodes"] == 2
    diffs = [abs(a - b) for a, b in zip(pp["losses"], records["ddp"]["losses"], strict=True)]
    assert max(diffs) <= 1e-5, diffs


def test_only_activations_cross_nodes(records):
    pp = records["pp"]
    held = pp["model"]["params_held_by_rank"]
    assert held[0] == held[1] and held[2] == held[3]  # ranks 0, 1: stage 0; ranks 2, 3: stage 1
    tiers = pp["comm_bytes_per_step"]["ring_bytes_sent_all_ranks_by_tier"]
    microbatches = ACCUM * 2  # a replica trains 2 data-parallel ranks' rows
    activation = MICRO * SEQ * pp["model"]["hidden"] * FP32
    # each of the 2 pipelines: stage 0 sends m activations, stage 1 m gradients, over the node boundary (+ the
    # grad norm's 4-byte all-reduce between the stages)
    assert tiers["inter_node"] == 2 * 2 * (microbatches * activation + FP32)
    # inside a node: each stage's DDP all-reduce of its fp32 gradients over its 2 data-parallel ranks (ring: 1x)
    assert tiers["intra_node"] == pytest.approx(2 * (held[0] + held[2]) * FP32)
    planned = pp["comm_bytes_per_step"]["predicted"]["all_ranks_by_tier"]
    assert planned["inter_node"] == tiers["inter_node"] - 2 * 2 * FP32  # the planner counts no grad-norm scalar
    assert ddp_inter_node(records) > 5 * tiers["inter_node"]  # 8x on this tiny model (its activations are large)


def ddp_inter_node(records) -> float:
    return records["ddp"]["comm_bytes_per_step"]["ring_bytes_sent_all_ranks_by_tier"]["inter_node"]

"""Issues 12 and 14 on the two-host rig: two network-namespace hosts (zkht0 / zkht1, 10.78.75.1 / .2) with two
ranks each, the veth capped at 200mbit per host egress (tc tbf), driven by benchmarks/link_cap/run.py.

- Hierarchical sharding sends fewer bytes over the inter-node link, by the amount zero_kit.plan.traffic plans
  (within 5%): zero3_hpz_release vs zero3_release (on this tiny model plain zero3 keeps every parameter gathered
  through backward, so only the release variants re-gather and show hpZ's effect), fsdp_hsdp vs fsdp. Their
  runs also carry the node-aware byte checks of tests/dist/test_bench_hierarchy.py (state bytes and bytes per tier
  against the planner within 1%, hpZ's and HSDP's state formulas) and ZeRO-3's accounting at four ranks.
- Model parallelism on the same rig (issue 26): zero1_tp (AutoTP 2-way inside each host, ZeRO-1 across them) and
  pp (one pipeline stage per host, DDP inside each stage's host) send over the inter-node link the bytes
  zero_kit.plan.parallel plans (within INTER_TOLERANCE: the planner leaves out only the few scalars of the
  gradient norm), and each rank holds the slice of the layout's rank order (tp pairs and stages by host).
  Their two runs add 93 s to this module on a loaded machine (zero1_tp 61 s, pp 32 s; the module 433 s).
- The planner's link seconds (zero_kit.plan.timing, zero_kit.plan.parallel_options for zero1_tp and pp, rates
  probed on the rig, gloo's reduce-scatter charged as the all-reduce it is) fit in the step measured at 200mbit,
  within STEP_TOLERANCE. The whole step's prediction (compute calibrated from a one-host 4-rank DDP run) is not
  asserted: its calibration is itself a timed run on 2 shared cores. Its two-sided accuracy (±25%, with the
  per-strategy overhead term) is the table in benchmarks/link_cap/results/, measured on a quiet machine.

Ports: 29953-29954 in the root namespace (one-host calibration), 29970-29979 inside zkht0/zkht1. The namespaces are
removed when the fixture ends, also on failure or timeout, and the last test checks it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace

import pytest

from benchmarks.link_cap.report import predict_rows, tiers
from benchmarks.link_cap.run import bench_options, calibrate, run
from tests.rigs.base import remove_etc_netns
from tests.rigs.netns import hosts_for, remove_hosts
from zero_kit.plan.accounting import model_state_bytes

pytestmark = [
    pytest.mark.multinode,
    pytest.mark.serial,  # the calibration and the timed steps must see the same machine: never beside another test
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None, reason="the rig needs root and iproute2"),
]
PREFIX, SUBNET, RATE = "zkht", 75, "200mbit"
PAIRS = (("zero3_hpz_release", "zero3_release"), ("fsdp_hsdp", "fsdp"))
MODEL_PARALLEL = ("zero1_tp", "pp")
NAMES = [name for pair in PAIRS for name in pair] + list(MODEL_PARALLEL)
STEP_TOLERANCE = 0.5
INTER_TOLERANCE = 0.02


def _teardown() -> None:
    remove_hosts(PREFIX)
    remove_etc_netns(hosts_for(PREFIX, SUBNET).names)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def found(tmp_path_factory, cpu_ops):
    out = tmp_path_factory.mktemp("link_cap")
    (out / "logs").mkdir()
    opts = replace(
        bench_options(out, steps=6, hidden_size=96, layers=2, vocab_size=256), master_port=29970, timeout=240
    )
    try:
        found = {**calibrate(opts, out, port=29953), **run(NAMES, [RATE], opts, out, PREFIX, SUBNET)}
        predict_rows(found)
    finally:
        _teardown()
    failed = [r["strategy"] for r in found["rows"] if not r["record"]]
    logs = "\n".join(p.read_text()[-1500:] for p in sorted((out / "logs").rglob("*.log")))
    assert not failed, f"failed: {failed}\n{logs}"
    return found


@pytest.fixture(scope="module")
def result(found):
    return {r["strategy"]: r for r in found["rows"]}


def test_every_run_is_two_hosts_of_two_ranks(result):
    for row in result.values():
        record = row["record"]
        assert (record["world_size"], record["nnodes"], record["ranks_per_node"]) == (4, 2, 2)
        assert all(sent > 0 for sent in row["wire_tx_bytes_per_run"])  # the veth really carried the traffic


@pytest.mark.parametrize(("hierarchical", "flat"), PAIRS)
def test_hierarchical_cuts_inter_node_bytes_by_the_planned_amount(result, hierarchical, flat):
    (h_counted, h_planned), (f_counted, f_planned) = (
        tiers(result[hierarchical]["record"]),
        tiers(result[flat]["record"]),
    )
    planned_cut = f_planned["inter_node"] - h_planned["inter_node"]
    assert planned_cut > 0.2 * f_planned["inter_node"]
    assert h_counted["inter_node"] < f_counted["inter_node"]
    assert f_counted["inter_node"] - h_counted["inter_node"] == pytest.approx(planned_cut, rel=0.05)


@pytest.mark.parametrize("name", MODEL_PARALLEL)
def test_model_parallel_inter_node_bytes_are_the_planned_ones(result, name):
    counted, planned = tiers(result[name]["record"])
    assert planned["inter_node"] > 0
    assert counted["inter_node"] == pytest.approx(planned["inter_node"], rel=INTER_TOLERANCE)


def test_model_parallel_rank_order_puts_tp_in_a_host_and_stages_across_hosts(result):
    """Rank = (stage x dp + dp index) x tp + tp index (zero_kit.plan.parallel), node = rank // 2: the tp pair is
    one host's two ranks (only ZeRO-1's data-parallel sync crosses), the pipeline's stages are the two hosts."""
    tp, pp = result["zero1_tp"]["record"], result["pp"]["record"]
    assert tp["parallel"] == {"tensor": 2, "pipeline": 1, "sequence": 1, "data": 2}
    assert pp["parallel"] == {"tensor": 1, "pipeline": 2, "sequence": 1, "data": 2}
    held = pp["model"]["params_held_by_rank"]
    assert held[0] == held[1] != held[2] == held[3]  # stage 0 on host 0, stage 1 on host 1
    tp_counted, _ = tiers(tp)
    assert tp_counted["intra_node"] > tp_counted["inter_node"]  # the per-layer all-reduces stay inside a host


@pytest.mark.parametrize("name", NAMES)
def test_the_planned_link_time_is_not_above_the_measured_step(result, name):
    """The planner's communication seconds (probed rates, the tbf cap, its collectives per tier) fit in the step
    measured at 200mbit. A planner that charges too much (a rate, a tier or a collective counted twice) fails here.
    Only the links are asserted: the compute rate is calibrated from one timed one-host run on the 2 shared cores,
    and load during that run (or a quiet moment during the two-host one) moved the whole-step prediction both ways
    (0.27 s planned against 0.55 s measured once, 0.072 s against 0.048 s for pp another time), so a bound on the
    whole step is a timed test that flakes. The whole step's accuracy both ways (29 of 30 within +-25% on a quiet
    machine) is the link_cap benchmark's table."""
    row = result[name]
    measured, comm, step = row["record"]["step_time_s"], row["predicted_comm_s"], row["predicted_step_s"]
    assert 0 < comm <= step, f"{name}: planned link {comm} s of a planned step of {step} s"
    assert comm <= measured * (1 + STEP_TOLERANCE), f"{name}: measured step {measured} s, planned link time {comm} s"


@pytest.mark.parametrize("name", [name for pair in PAIRS for name in pair])
def test_state_and_tier_bytes_match_the_planner_within_1_percent(result, name):
    """The node-aware strategies' byte checks of tests/dist/test_bench_hierarchy.py (issue 12), on these runs: each
    rank's model-state bytes against the planner's tables, and the ring bytes per link tier against
    zero_kit.plan.traffic. A rank's bytes do not depend on where it runs, only the tiers do."""
    record = result[name]["record"]
    state = record["model_state_bytes_per_rank"]
    assert "error" not in state["predicted"], state["predicted"]
    for rank_state, expected in zip(state["all_ranks"], state["predicted"]["all_ranks_total"], strict=True):
        assert rank_state["total"] == pytest.approx(expected, rel=0.01), (name, state["predicted"]["formula"])
    counted, planned = tiers(record)
    for tier in ("intra_node", "inter_node"):
        assert counted[tier] == pytest.approx(planned[tier], rel=0.01), (name, tier)


def test_hierarchical_state_bytes_and_zero3_at_four_ranks_by_formula(result, found):
    """hpZ holds ZeRO-3's 20Ψ/N plus the secondary fp32 partition over the node, 4Ψ/L; HSDP shards inside the node
    only; ZeRO-3 at four ranks (issue 4's accounting, two ranks in test_bench_compare.py) holds 20Ψ/N and sends the
    paper's 3Ψ, 1.5x DDP's ring bytes (DDP: the one-host calibration run of the same model and batch)."""
    record = {name: row["record"] for name, row in result.items()}
    n = record["zero3_release"]["model"]["n_params"]
    total = {name: r["model_state_bytes_per_rank"]["total"] for name, r in record.items()}
    assert total["zero3_hpz_release"] - total["zero3_release"] == pytest.approx(4 * n / 2, rel=0.01)
    assert total["fsdp_hsdp"] == pytest.approx(16 * n / 2, rel=0.01)
    planned = model_state_bytes("zero3", n, 4, "fp32")
    assert planned.total == 20 * n // 4
    for rank in record["zero3_release"]["model_state_bytes_per_rank"]["all_ranks"]:
        assert rank["total"] == pytest.approx(planned.total, rel=0.01), (rank, planned.formula)
    ddp = found["ddp_one_host"]
    assert ddp["model"]["n_params"] == n and ddp["world_size"] == 4
    ring = record["zero3_release"]["comm_bytes_per_step"]["ring_bytes_sent_per_rank"]
    assert ring / ddp["comm_bytes_per_step"]["ring_bytes_sent_per_rank"] == pytest.approx(1.5, abs=0.05)


def test_the_rig_is_gone():
    assert f"{PREFIX}0" not in _namespaces() and f"{PREFIX}1" not in _namespaces()
    assert not any(os.path.exists(f"/etc/netns/{PREFIX}{node}") for node in (0, 1))

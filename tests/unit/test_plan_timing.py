"""The step-time model on cases computed by hand: Ψ = 1e9 on 2 nodes x 2 GPUs, 10 Gbit/s between nodes and
100 GB/s inside them; the dominant term moving from compute to the inter-node link; ranking by time; the
refusals of the new flags; --calibrate on a hand-written results.jsonl."""

from __future__ import annotations

import json

import pytest

from zero_kit.cli import main
from zero_kit.plan import Hardware, LlamaShape, Workload, make_plan
from zero_kit.plan.rates import GBIT, Rates
from zero_kit.plan.timing import step_time
from zero_kit.strategies import STRATEGIES

PSI = 10**9
SHAPE = LlamaShape(hidden_size=1024, layers=2, heads=8, kv_heads=8, intermediate_size=2816, vocab_size=32000)
WORK = Workload(SHAPE, PSI, seq_len=2000, micro_batch=1, precision="bf16")
HARDWARE = Hardware(gpu_mem=80 * 10**9, gpus_per_node=2, nodes=2, inter_node_gbps=10)
# 6Ψ + 12 L h s = 6e9 + 12 x 2 x 1024 x 2000 FLOPs per token, x 2000 tokens, at 1e14 FLOP/s
COMPUTE_S = (6e9 + 12 * 2 * 1024 * 2000) * 2000 / 1e14


def _rates(inter_gbps=10.0, latency_s=0.0, overlap=0.0, flops=1e14):
    return Rates(
        flops_per_s=flops,
        intra_bytes_per_s=100e9,  # 100 GB/s = 800 Gbit/s
        inter_bytes_per_s=inter_gbps * GBIT,
        latency_s=latency_s,
        pcie_bytes_per_s=25e9,
        cpu_mem_bytes_per_s=200e9,
        cpu_adam_bytes=30,
        overlap=overlap,
        compute_source="hand",
    )


def _by_what(t):
    return {c.collective.what: c for c in t.comms}


def test_compute_term():
    t = step_time(STRATEGIES["ddp"], WORK, HARDWARE, _rates())
    assert t.compute_s == pytest.approx(COMPUTE_S)  # 0.12098 s
    checkpointed = step_time(
        STRATEGIES["ddp"], Workload(SHAPE, PSI, 2000, activation_checkpointing=True), HARDWARE, _rates()
    )
    assert checkpointed.compute_s == pytest.approx(COMPUTE_S * 4 / 3)


def test_ddp_ring_bytes_per_tier_by_hand():
    t = step_time(STRATEGIES["ddp"], WORK, HARDWARE, _rates())
    (c,) = t.comms
    # all-reduce of fp32 grads, S = 4e9, N = 4: each GPU sends 2 x 3/4 x 4e9 = 6e9 bytes to its ring successor;
    # the ring crosses the 2 nodes twice, so each node sends one share, 6e9, over its 10 Gbit/s (1.25 GB/s) link.
    assert c.ring_bytes == pytest.approx(6e9)
    assert c.intra_s == pytest.approx(6e9 / 100e9)  # 0.06 s
    assert c.inter_s == pytest.approx(6e9 / 1.25e9)  # 4.8 s
    assert c.tier == "inter-node comm" and t.dominant == "inter-node comm"
    assert t.step_s == pytest.approx(COMPUTE_S + 4.8)  # overlap 0
    assert t.tokens_per_s == pytest.approx(4 * 2000 / (COMPUTE_S + 4.8))


def test_latency_is_per_call_and_overlap_is_capped_by_compute():
    t = step_time(STRATEGIES["ddp"], WORK, HARDWARE, _rates(latency_s=1e-4, overlap=0.8))
    (c,) = t.comms
    assert c.collective.calls == 153  # ceil(4e9 / 25 MiB) buckets
    assert c.latency_s == pytest.approx(153e-4)
    assert t.hidden_s == pytest.approx(COMPUTE_S)  # 0.8 x 4.8 s > compute: hidden only up to the compute time
    assert t.step_s == pytest.approx(4.8 + 153e-4)


def test_zero2_and_zero3_collectives_by_hand():
    z2 = _by_what(step_time(STRATEGIES["zero2"], WORK, HARDWARE, _rates()))
    # DeepSpeed 0.19.8: all-reduce of 16-bit buckets (2 x 3/4 x 2e9) then all-gather of partitions (3/4 x 2e9)
    assert z2["all-reduce grad buckets"].ring_bytes == pytest.approx(3e9)
    assert z2["all-gather updated params"].ring_bytes == pytest.approx(1.5e9)
    z3 = _by_what(step_time(STRATEGIES["zero3"], WORK, HARDWARE, _rates()))
    assert z3["all-gather params (fwd)"].ring_bytes == pytest.approx(1.5e9)
    # the last 5e8 parameters stay gathered (reuse distance 1e9 ~ twice the parameters after them)
    assert z3["all-gather params (bwd)"].ring_bytes == pytest.approx(0.75e9)
    assert z3["reduce-scatter grads"].ring_bytes == pytest.approx(1.5e9)
    assert sum(c.inter_s for c in z3.values()) == pytest.approx(3.75e9 / 1.25e9)


def test_single_node_has_no_inter_node_term():
    one_node = Hardware(gpu_mem=80 * 10**9, gpus_per_node=4, nodes=1)
    (c,) = step_time(STRATEGIES["ddp"], WORK, one_node, _rates()).comms
    assert c.inter_s == 0 and c.intra_s == pytest.approx(6e9 / 100e9) and c.tier == "intra-node comm"


def test_offload_terms_by_hand():
    t = step_time(STRATEGIES["zero2_offload"], WORK, HARDWARE, _rates())
    assert t.pcie_s == pytest.approx(2 * 2 * PSI / 4 / 25e9)  # 16-bit grads down + params up, Ψ/N each
    assert t.cpu_adam_s == pytest.approx(2 * PSI / 4 * 30 / 200e9)  # 2 ranks per node share memory bandwidth


def test_dominant_switches_from_compute_to_inter_node_as_bandwidth_drops():
    dominant = {gbps: step_time(STRATEGIES["zero2"], WORK, HARDWARE, _rates(gbps)).dominant for gbps in (1e5, 10)}
    assert dominant == {1e5: "compute", 10: "inter-node comm"}


def test_rank_by_time_picks_the_fastest_fitting_option():
    plan = make_plan(WORK, HARDWARE, _rates(overlap=0.8), rank_by="time")
    fitting = [o for o in plan.options if o.fits]
    assert plan.recommended is min(fitting, key=lambda o: o.timing.step_s)
    assert "predicted step time" in plan.reasons[-1]
    # ranked by memory on this 10 Gbit/s link: the fewest bytes per node between nodes (plan.traffic): ZeRO-0's one
    # all-reduce of 16-bit grads (3e9) ties zero3+hpz and sends fewer bytes per rank; ZeRO-1/2 send 4.5e9
    assert make_plan(WORK, HARDWARE, _rates(), rank_by="memory", layouts=[]).recommended.label == "zero0"


def _cli(capsys, *argv):
    code = main(["plan", "--params", "8e9", "--gpus-per-node", "8", "--nodes", "2", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_and_json_carry_step_times(capsys):
    code, out, _ = _cli(capsys, "--gpu-mem", "80GB", "--inter-node-gbps", "100")
    assert code == 0 and "predicted step time" in out and "inter-node comm" in out
    code, out, _ = _cli(capsys, "--gpu-mem", "80GB", "--inter-node-gbps", "100", "--json", "--rank-by", "time")
    doc = json.loads(out)
    timing = {o["label"]: o["timing"] for o in doc["options"]}
    assert timing["zero2"]["dominant"] == "inter-node comm" and timing["zero2"]["step_time_s"] > 0
    best = doc["recommended"]["label"]
    fits = [o for o in doc["options"] if o["fits"]]
    assert timing[best]["step_time_s"] == min(o["timing"]["step_time_s"] for o in fits)
    assert doc["hardware"]["assume"]["cuda_context_nccl_gib"] == 1.0


def test_refusals_name_every_flag_at_once(capsys, tmp_path):
    missing = tmp_path / "nope.jsonl"
    argv = ["--inter-node-gbps", "0", "--intra-node-gbps", "-5", "--mfu", "1.5", "--calibrate", str(missing)]
    code, _, err = _cli(capsys, "--gpu-mem", "80GB", *argv, "--assume", "overlap=2,bogus=1")
    assert code == 2
    for text in (
        "--inter-node-gbps",
        "--intra-node-gbps",
        "--mfu must be in (0, 1]",
        "no such file",
        "overlap",
        "bogus",
    ):
        assert text in err
    assert "--mfu and --calibrate" in err


def test_assume_overrides_the_stated_constants(capsys):
    code, out, _ = _cli(capsys, "--gpu-mem", "80GB", "--json", "--assume", "cuda_context_nccl_gib=2,allocator_slack=0")
    doc = json.loads(out)
    buffers = doc["options"][0]["terms"]["buffers"]
    assert buffers["CUDA context + NCCL"]["bytes"] == 2 * 2**30 and buffers["allocator slack"]["bytes"] == 0
    code, out, _ = _cli(capsys, "--gpu-mem", "80GB")
    assert "cuda_context_nccl_gib=1, allocator_slack=0.05" in out


def test_calibrate_from_a_hand_written_results_file(capsys, tmp_path):
    results = tmp_path / "results.jsonl"
    ddp = {
        "strategy": "ddp",
        "device": "cuda",
        "world_size": 1,
        "flops_per_token": 6e9,
        "tokens_per_s": {"per_rank": 1000.0},
    }
    other = {"strategy": "zero3", "flops_per_token": 6e9, "tokens_per_s": {"per_rank": 9e9}}
    results.write_text(json.dumps(other) + "\n" + json.dumps(ddp) + "\n{torn")
    code, out, _ = _cli(capsys, "--gpu-mem", "80GB", "--calibrate", str(results), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["rates"]["flops_per_s"] == pytest.approx(6e12)  # 6e9 FLOPs/token x 1000 tokens/s
    compute = doc["options"][0]["timing"]["seconds"]["compute"]
    fpt = 6 * 8e9 + 12 * 32 * 4096 * 2048  # llama-3-8b dimensions at seq 2048
    assert compute == pytest.approx(fpt * 2048 / 6e12)
    results.write_text(json.dumps(other) + "\n")
    code, _, err = _cli(capsys, "--gpu-mem", "80GB", "--calibrate", str(results))
    assert code == 2 and "--calibrate" in err and "no usable record" in err


@pytest.mark.parametrize("name", ["ddp", "zero2", "zero3", "zero2_offload"])
def test_phases_regroup_the_same_terms_and_add_up_to_the_step(name):
    # Issue 36: the planner's step in the bench's phase names, no new model: compute, collectives by kind, hidden.
    t = step_time(STRATEGIES[name], WORK, HARDWARE, _rates(latency_s=1e-5, overlap=0.8))
    phases = t.phases
    assert sum(phases.values()) == pytest.approx(t.step_s)
    assert phases["forward_backward"] == t.compute_s and phases["hidden_comm"] == -t.hidden_s
    assert phases["reduction"] + phases["gather"] + phases["p2p"] == pytest.approx(t.comm_s)
    assert phases["step"] == t.offload_s
    by_what = _by_what(t)
    gathers = sum(c.seconds for what, c in by_what.items() if what.startswith("all-gather"))
    assert phases["gather"] == pytest.approx(gathers) and (gathers > 0) == (name != "ddp")
    assert phases["reduction"] > 0

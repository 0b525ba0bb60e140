"""The planner's bytes per link tier (zero_kit.plan.traffic) for every planned strategy, hpZ and HSDP included:
the closed forms against an enumeration of every rank's ring successor with metrics.ring_link_tier (what the
benchmark's counter does), hand-computed hierarchical cases, the secondary partition's and the bf16 states'
memory, and the slow-link recommendation by inter-node bytes."""

from __future__ import annotations

import pytest

from zero_kit.metrics import ring_bytes, ring_link_tier
from zero_kit.plan import KNOWN_SHAPES, Hardware, Workload, make_plan, model_state_bytes
from zero_kit.plan.accounting import strategy_state_bytes
from zero_kit.plan.traffic import collectives, group_size, tier_bytes
from zero_kit.strategies import STRATEGIES

SHAPE = KNOWN_SHAPES["llama-3-8b"]
WORK = Workload(SHAPE, SHAPE.n_params, precision="bf16")


def _group(kind: str, rank: int, nodes: int, per_node: int) -> list[int]:
    node, place = divmod(rank, per_node)
    return {
        "world": list(range(nodes * per_node)),
        "node": [node * per_node + i for i in range(per_node)],
        "across": [m * per_node + place for m in range(nodes)],
    }[kind]


@pytest.mark.parametrize("name", [n for n, info in STRATEGIES.items() if info.planned or info.benchable])
@pytest.mark.parametrize(("nodes", "per_node"), [(1, 4), (2, 2), (2, 8), (4, 1), (3, 4)])
def test_tier_split_equals_every_ranks_ring_successor(name, nodes, per_node):
    for c in collectives(STRATEGIES[name], WORK, per_node):
        split = {"intra_node": 0.0, "inter_node": 0.0}
        for rank in range(nodes * per_node):
            group = _group(c.group, rank, nodes, per_node)
            if len(group) > 1:
                split[ring_link_tier(group, rank, per_node)] += ring_bytes(c.kind, c.payload, len(group))
        tiers = tier_bytes(c, nodes, per_node)
        assert (tiers.intra_node, tiers.inter_node) == pytest.approx((split["intra_node"], split["inter_node"]))
        assert tiers.per_rank == ring_bytes(c.kind, c.payload, group_size(c.group, nodes, per_node))


def _by_what(name: str, per_node: int = 8):
    return {c.what: c for c in collectives(STRATEGIES[name], WORK, per_node)}


def test_hierarchical_groups_by_hand():
    psi = SHAPE.n_params
    hpz, zero3 = _by_what("zero3_hpz"), _by_what("zero3")
    assert hpz["all-gather params (bwd)"].group == "node" and zero3["all-gather params (bwd)"].group == "world"
    assert hpz["all-gather params (fwd)"].group == hpz["reduce-scatter grads"].group == "world"
    hsdp = _by_what("fsdp_hsdp")
    assert {c.group for w, c in hsdp.items() if "all-reduce" not in w} == {"node"}
    across = hsdp["all-reduce grad shards across nodes"]
    assert (across.group, across.payload) == ("across", 4 * -(-psi // 8))  # the fp32 gradient shard of one rank
    reshard = _by_what("fsdp_reshard_node")
    assert reshard["all-gather params (bwd)"].group == "node" and reshard["all-gather params (fwd)"].group == "world"
    # one rank per node: DeepSpeed makes no secondary partition (hpZ needs 2+ ranks in a group), all world
    assert _by_what("zero3_hpz", per_node=1)["all-gather params (bwd)"].group == "world"
    # bf16 states move 16-bit tensors whatever the run's precision
    fp32 = Workload(SHAPE, psi, precision="fp32")
    assert {c.payload for c in collectives(STRATEGIES["zero3_bf16states"], fp32)} >= {2 * psi}


def test_inter_node_bytes_per_node_by_hand():
    # 2 nodes x 8: HSDP sends only its shards' all-reduce between nodes: L x 2(M-1)/M x 4Ψ/L = 4Ψ per node
    plan = make_plan(WORK, Hardware(80 * 10**9, gpus_per_node=8, nodes=2))
    by = {o.info.name: o for o in plan.options}
    psi = SHAPE.n_params
    assert by["fsdp_hsdp"].inter_node_bytes_per_node == pytest.approx(4 * psi, rel=1e-6)
    # hpZ: ZeRO-3's forward all-gather and reduce-scatter cross (15/16 x 2Ψ each); its backward re-gather does not
    assert by["zero3_hpz"].inter_node_bytes_per_node == pytest.approx(2 * 15 / 16 * 2 * psi, rel=1e-6)
    regathered = by["zero3"].inter_node_bytes_per_node - by["zero3_hpz"].inter_node_bytes_per_node
    assert regathered == pytest.approx(15 / 16 * 2 * (psi - 5 * 10**8), rel=1e-6)
    assert by["zero3"].traffic.intra_node + by["zero3"].traffic.inter_node == pytest.approx(
        16 * by["zero3"].traffic.per_rank
    )


def test_secondary_partition_and_bf16_states_memory():
    psi, world, per_node = SHAPE.n_params, 16, 8
    zero3 = model_state_bytes("zero3", psi, world, "bf16")
    hpz = strategy_state_bytes(STRATEGIES["zero3_hpz"], psi, world, per_node, "bf16")
    assert hpz.params - zero3.params == 2 * -(-psi // per_node) and hpz.formula == zero3.formula + " + 2Ψ/N_node"
    hsdp = strategy_state_bytes(STRATEGIES["fsdp_hsdp"], psi, world, per_node, "bf16")
    assert hsdp.total == 16 * -(-psi // per_node) and hsdp.formula == "16Ψ/N_node"
    assert strategy_state_bytes(STRATEGIES["zero3_hpz"], psi, 8, 8, "bf16") == model_state_bytes(
        "zero3", psi, 8, "bf16"
    )
    low = strategy_state_bytes(STRATEGIES["zero3_bf16states"], psi, world, per_node, "bf16")
    assert (low.params, low.grads, low.optimizer) == tuple(k * -(-psi // world) for k in (2, 2, 6))
    assert zero3.total / low.total == pytest.approx(18 / 10, rel=1e-6)  # the 18 -> 10 bytes per parameter


def test_slow_link_recommends_the_fewest_inter_node_bytes():
    hardware = Hardware(80 * 10**9, gpus_per_node=8, nodes=2, inter_node_gbps=10)
    slow = make_plan(WORK, hardware, layouts=[])  # data parallelism alone
    assert slow.recommended.label == "zero3+hpz"
    assert any("28.0 GiB per node per step between nodes, against" in reason for reason in slow.reasons)
    fast = make_plan(WORK, Hardware(80 * 10**9, gpus_per_node=8, nodes=2))
    assert fast.recommended.label == "zero2"  # the fast fabric keeps the old ranking: unsharded, fewest bytes per rank
    # with the default layouts, a pipeline stage per node sends only activations over the slow link, and says its
    # bubble: m = tp x pp = 2 micro batches per step, fewer than 4 x 2 stages, idle 1/3 of the step
    piped = make_plan(WORK, hardware)
    assert piped.recommended.label == "zero1+pp2"
    assert any(
        "bubble idles (p-1)/(m+p-1) = 33%" in reason and "fewer than the 8" in reason for reason in piped.reasons
    )


def test_bf16_states_only_when_they_save_offload():
    big = KNOWN_SHAPES["llama-3-70b"]
    plan = make_plan(
        Workload(big, big.n_params, seq_len=1024, activation_checkpointing=True), Hardware(80 * 10**9, 8, nodes=2)
    )
    fitting = {o.info.name for o in plan.options if o.fits}
    if "zero3" in fitting:
        assert plan.recommended.info.name != "zero3_bf16states"
    else:
        assert plan.recommended.info.name == "zero3_bf16states"
        assert any("updates round to bf16" in reason for reason in plan.reasons)


def test_ulysses_all_to_alls_by_hand(capsys):
    """--sp 8, Llama-3-8B at 32k tokens: 4 all-to-alls a layer over the sp group (k and v replicated up to 8 heads),
    each rank sending 7/8 of its b s/8 slice, in forward and backward (and the recomputed forward with activation
    checkpointing), inside the node, not overlapped, timed in forward_backward. docs/long_sequences.md quotes the
    figures of the plan's JSON."""
    import json
    from dataclasses import replace

    from zero_kit.cli import main

    shape = KNOWN_SHAPES["llama-3-8b"]
    work = Workload(shape, shape.n_params, 32768, 1, "bf16", sp=8)
    (a2a,) = [c for c in collectives(STRATEGIES["zero3"], work, 8) if c.kind == "alltoall"]
    per_pass = 32 * 4096 * (2 * 32 + 2 * 8) * 128 * 2  # layers x b s/sp x (q, out: 32 heads; k, v: 8) x d x bf16
    assert (a2a.payload, a2a.calls, a2a.overlappable, a2a.size) == (2 * per_pass, 256, False, 8)
    tiers = tier_bytes(a2a, 1, 8)
    assert (tiers.per_rank, tiers.inter_node) == (7 / 8 * 2 * per_pass, 0.0)
    assert tier_bytes(a2a, 2, 8).inter_node == 0.0  # a group of 8 on nodes of 8 never crosses a node
    checkpointed = [c for c in collectives(STRATEGIES["zero2"], replace(work, activation_checkpointing=True), 8)]
    assert [c.payload for c in checkpointed if c.kind == "alltoall"] == [3 * per_pass]
    assert not [c for c in collectives(STRATEGIES["zero3"], replace(work, sp=1), 8) if c.kind == "alltoall"]
    argv = ["plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "--gpus-per-node", "8", "--seq-len", "32768"]
    assert main([*argv, "--sp", "8", "--json"]) == 0
    zero3 = next(o for o in json.loads(capsys.readouterr().out)["options"] if o["label"] == "zero3")
    shown = next(c for c in zero3["timing"]["collectives"] if c["kind"] == "alltoall")
    assert (
        round(shown["ring_bytes_sent_per_gpu"] / 2**30, 1) == 4.4
        and round(zero3["comm_bytes_per_step"] / 2**30, 1) == 44.9
    )
    assert (
        round(shown["intra_node_s"] + shown["latency_s"], 3) == 0.016
        and round(zero3["timing"]["step_time_s"], 2) == 1.07
    )
    phases = zero3["timing"]["phases_s"]
    assert phases["p2p"] == 0.0 and phases["forward_backward"] > zero3["timing"]["seconds"]["compute"]

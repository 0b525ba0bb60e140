"""`zero-kit train --sp N` before any rank starts: the data-parallel size is world / sp, computed once in the plan;
a world or a node that --sp does not divide, --pack and --method dpo with --sp are refused with the fix; the collator
pads rows to a multiple of sp (to --max-length on CPU ranks, where gloo gathers one size) and adds position ids."""

from __future__ import annotations

import pytest

from zero_kit.data.dataset import DataCollator
from zero_kit.errors import UserError
from zero_kit.train.options import TrainOptions, check_options
from zero_kit.train.plan import Host, dp_size_of, plan_run

CPU = Host(on_gpu=False, bf16_supported=False)


def _plan(tmp_path, environ=None, **options):
    return plan_run(TrainOptions(output=str(tmp_path / "out"), **options), environ or {}, CPU)


def test_the_plan_divides_the_world_by_sp(tmp_path):
    plan = _plan(tmp_path, nproc=4, sp=2)
    assert (plan.world_size, plan.dp_size) == (4, 2)
    assert _plan(tmp_path, nproc=4).dp_size == 4
    # an outside launcher's ranks: the same function, from its environment
    launched = _plan(tmp_path, {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "RANK": "0"}, sp=4)
    assert (launched.world_size, launched.dp_size) == (4, 1)


def test_a_world_or_a_node_sp_does_not_divide_is_refused_with_the_fix():
    with pytest.raises(UserError) as err:
        dp_size_of(3, 2)
    assert "--sp 2 does not divide the world size 3 (the job's ranks)" in str(err.value) and "3" in err.value.fix
    with pytest.raises(UserError) as err:  # 2 nodes of 3: a group of 2 would span the nodes
        dp_size_of(6, 2, per_node=3)
    assert "per node" in str(err.value) and "divides 3" in err.value.fix
    assert dp_size_of(8, 4, per_node=4) == 2


@pytest.mark.parametrize(("options", "said"), [
    ({"sp": 0}, "--sp"),
    ({"sp": 2, "pack": True}, "--pack with --sp 2"),
    ({"sp": 2, "method": "dpo"}, "--sp 2 with --method dpo"),
])  # fmt: skip
def test_flags_that_cannot_go_with_sp_are_refused(options, said):
    with pytest.raises(UserError) as err:
        check_options(TrainOptions(**options))
    assert said in str(err.value)


def test_sp_1_changes_nothing():
    check_options(TrainOptions(sp=1, pack=True))
    assert DataCollator.for_sp(0, 1).positions is False


def test_the_collator_pads_to_a_multiple_of_sp_with_positions_and_to_the_length_on_cpu():
    rows = [{"input_ids": [5, 6, 7], "labels": [5, 6, 7], "attention_mask": [1, 1, 1]},
            {"input_ids": [8, 9, 10, 11, 12], "labels": [-100, 9, 10, 11, 12], "attention_mask": [1] * 5}]  # fmt: skip
    batch = DataCollator.for_sp(0, 2)(rows)
    assert batch["input_ids"].shape == (2, 6)
    assert batch["position_ids"].tolist() == [list(range(6))] * 2
    assert batch["labels"][0].tolist() == [5, 6, 7, -100, -100, -100]  # padding is out of the loss
    fixed = DataCollator.for_sp(0, 4, length=10)(rows)
    assert fixed["input_ids"].shape == (2, 12)  # --max-length 10 rounded up to a multiple of 4


def test_the_planner_divides_a_ranks_tokens_by_sp_and_the_memory_check_follows(tmp_path):
    """`zero-kit plan --sp N` and the run's memory check: activations, logits and compute of seq_len / sp tokens per
    rank; Llama-3-8B at 32k on one 8 x 80 GB node fits under ZeRO-3 with --sp 8, not without."""
    import json
    import subprocess
    import sys

    from zero_kit.plan.memory import activation_terms
    from zero_kit.plan.shapes import LlamaShape
    from zero_kit.plan.workload import Workload

    shape = LlamaShape(4096, 32, 32, 8, 14336, 128256)
    whole, split = (Workload(shape, shape.n_params, 32768, sp=sp) for sp in (1, 8))
    assert split.rank_tokens * 8 == whole.rank_tokens
    assert sum(v for v, _ in activation_terms(split).values()) * 8 == sum(
        v for v, _ in activation_terms(whole).values()
    )
    plans = {}
    for sp in (1, 8):
        argv = [sys.executable, "-m", "zero_kit.cli", "plan", "--model", "llama-3-8b", "--gpu-mem", "80GB",
                "--gpus-per-node", "8", "--seq-len", "32768", "--sp", str(sp), "--json"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == (1 if sp == 1 else 0), done.stderr  # 1: no option fits
        plans[sp] = json.loads(done.stdout)
    fits = {sp: [o["name"] for o in plan["options"] if o["fits"]] for sp, plan in plans.items()}
    assert fits[1] == [] and "zero3" in fits[8] and plans[8]["recommended"], fits
    view = {sp: _plan(tmp_path, nproc=2, sp=sp).planner() for sp in (1, 2)}  # what the run's memory check reads
    assert view[2].workload.rank_tokens * 2 == view[1].workload.rank_tokens


def test_tiled_compute_plans_one_slice_of_logits_and_no_mlp_intermediates():
    """--tiled-compute in the planner: the logits phases charge one slice (zero_kit.plan.workload.tile_slices, the
    count zero_kit.train.long_sequences.tiled cuts), the layers save no MLP intermediates, one more MLP and head
    forward per token; Llama-3-8B at 128k tokens on one 8 x 80 GB node fits with --sp 8 and tiling."""
    from zero_kit.plan.memory import activation_terms
    from zero_kit.plan.shapes import LlamaShape
    from zero_kit.plan.timing import compute_seconds
    from zero_kit.plan.workload import Workload, tile_slices

    shape = LlamaShape(4096, 32, 32, 8, 14336, 128256)
    plain, tiled = (Workload(shape, shape.n_params, 131072, sp=8, tiled=t) for t in (False, True))
    assert tiled.slices == tile_slices(16384, 1, 4096, 128256) == 8  # 16384 tokens of fp32 logits: 7.8 GiB / 1 GiB
    terms = {w.tiled: activation_terms(w) for w in (plain, tiled)}
    logits = {t: next(v for k, (v, _) in terms[t].items() if "log-softmax" in k) for t in terms}
    assert logits[False] == 8 * logits[True]
    assert sum(v for v, _ in terms[True].values()) < 0.4 * sum(v for v, _ in terms[False].values())
    rates = type("Rates", (), {"flops_per_s": 1.0})()
    assert compute_seconds(tiled, rates) > compute_seconds(plain, rates)


def test_longest_is_the_last_length_that_fits_and_names_what_limits_it():
    """`zero-kit plan --longest`: for each data-parallel option, the found length fits and one sp step more does not."""
    from dataclasses import replace

    from zero_kit.plan.memory import PLANNED, Hardware, evaluate
    from zero_kit.plan.recommend import longest_sequences
    from zero_kit.plan.shapes import LlamaShape
    from zero_kit.plan.workload import Workload

    shape = LlamaShape(4096, 32, 32, 8, 14336, 128256)
    work = Workload(shape, shape.n_params, 32768, sp=8, tiled=True)
    hardware = Hardware(80 * 10**9, 8, 1)
    found = {longest.label: longest for longest in longest_sequences(work, hardware)}
    for info in PLANNED:
        label = evaluate(info, work, hardware).label
        longest = found[label]
        if longest.seq_len:
            assert evaluate(info, replace(work, seq_len=longest.seq_len), hardware).fits
            assert longest.limit_terms
        assert not evaluate(info, replace(work, seq_len=longest.seq_len + 8), hardware).fits
    assert found["zero3"].seq_len > 32768 * 2 and found["ddp"].seq_len == 0


def test_sp_on_libraries_without_sequence_parallelism_is_refused_naming_them():
    """The oldest supported set (accelerate 1.11, transformers 4.57: CI's compatibility job) has no Ulysses in the
    Trainer: --sp is refused before any launch, naming the installed versions; the newest set runs it."""
    import importlib.metadata as metadata

    from zero_kit.train.guards.inputs import check_inputs
    from zero_kit.train.long_sequences import check_sp_support

    try:
        from accelerate.utils import DeepSpeedSequenceParallelConfig  # noqa: F401

        supported = True
    except ImportError:
        supported = False
    if supported:
        check_sp_support()
        return
    with pytest.raises(UserError) as err:
        check_inputs(TrainOptions(sp=2, nproc=2), output=False)
    assert f"accelerate {metadata.version('accelerate')}" in str(err.value) and "--sp" in str(err.value)

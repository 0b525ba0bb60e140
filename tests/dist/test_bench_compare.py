"""Real launches (torchrun for ddp/fsdp, the deepspeed launcher for ZeRO) of a tiny LLaMA on 2 CPU ranks:
fp32 loss parity over 20 steps, measured model-state bytes against the ZeRO accounting, collective bytes
against DDP, and each step split into phases; beside them a user's own config (`--ds-config`, issue 36): the file
`zero-kit config --stage 2 --device cpu` writes, which must match ZeRO-2 and DDP; and a row under Ulysses sequence
parallelism (issue 48), which must match its sp=1 twin. One benchmark run serves every
test in this module (ports 29710-29719; the first is held, so DDP's run meets on a free one, as beside another
job)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

from tests.support import docs
from zero_kit.bench import BenchOptions, run_bench
from zero_kit.cli import main
from zero_kit.dist import THP_ENV
from zero_kit.plan.accounting import model_state_bytes, zero12_edge_grad_bytes
from zero_kit.plan.traffic import ulysses
from zero_kit.plan.workload import from_record
from zero_kit.strategies import SP_SUFFIX

pytestmark = pytest.mark.dist
# zero3_release is ZeRO-3 with parameters released after forward (the paper's schedule); the generator's default
# zero3 runs in the multinode test and in the recorded benchmark. Kept to 8 launches for CI time.
STRATEGIES = ["ddp", "fsdp", "zero1", "zero2", "zero2_sp2", "zero3_release", "zero3_release_sp2"]
SP = "zero3_release_sp2"
"""zero3_release with Ulysses groups of 2 ranks per row (`zero-kit bench --sp 2` adds such a row after each ZeRO
strategy; named alone here, one launch): each rank holds 16 of every row's 32 tokens. zero2_sp2 is ZeRO-2's, whose
gradients DeepSpeed 0.19.6 and later hand back sp x too large unless corrected (lint.installed.ulysses_gradient_scale)."""
SP_ROWS = ("zero2_sp2", SP)
USER = "ds_config:my_zero2"
"""The row of --ds-config my_zero2.json (docs/comparing.md's name): one more launch, after the named strategies."""
RUNS = [*STRATEGIES, USER]
PSI_BYTES_FP32 = 4


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    """The generator's ZeRO-2 CPU config at the bench's learning rate and buckets for its hidden size, with batch keys
    the bench must replace (micro 7 x accum 3 x 2 ranks = train_batch_size 42)."""
    path = tmp_path_factory.mktemp("config") / "my_zero2.json"
    argv = ["config", "--stage", "2", "--device", "cpu", "--lr", str(BenchOptions().lr), "--hidden-size", "96",
            "--micro-batch", "7", "--grad-accum", "3", "--world-size", "2", "-o", str(path)]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(path.read_text())["train_batch_size"] == 42
    return path


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def records(bench_out, user_file):
    out = bench_out
    opts = BenchOptions(strategies=",".join(STRATEGIES), nproc=2, hidden_size=96, layers=2, vocab_size=256,
                        seq_len=32, micro_batch=2, grad_accum=2, steps=20, warmup=2, out=str(out),
                        master_port=29710, timeout=240, ds_comms_log=True, ds_config=str(user_file))  # fmt: skip
    lines = []
    with socket.socket() as held:  # DDP's port is taken (as by another job): its run meets on a free one, said once
        with contextlib.suppress(OSError):  # something holds it already
            held.bind(("", opts.master_port))
            held.listen()
        run_bench(opts, progress=lines.append)
    assert len([line for line in lines if f"port {opts.master_port} is in use" in line]) == 1
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    failed = {r["strategy"]: Path(r["log"]).read_text().splitlines()[-80:] for r in results if r.get("failed")}
    assert not failed, json.dumps(failed, indent=1)  # each failed run's log, not a row count
    assert any("step 20/20" in line for line in lines)  # the progress display saw every run finish
    assert not [line for line in lines if "trains otherwise" in line]  # the file trains as the bench's strategies
    table = (out / "table.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| strategy |")]
    assert len(rows) == 2 * len(RUNS)  # the main table and the phase table, a row per strategy each
    assert "Step phases, ms" in table
    assert all((out / f"{name}.png").stat().st_size > 10_000 for name in ("throughput", "memory", "loss"))
    return {r["strategy"]: r for r in results}


def test_every_strategy_ran_and_recorded_the_required_fields(records):
    assert sorted(records) == sorted(RUNS)
    for r in records.values():
        assert not r.get("failed"), r.get("log_tail")
        assert r["world_size"] == 2 and r["precision"] == "fp32" and len(r["losses"]) == 20
        assert r["step_time_s"] > 0 and r["tokens_per_s"]["total"] == pytest.approx(2 * r["tokens_per_s"]["per_rank"])
        assert set(r["model_state_bytes_per_rank"]) >= {"params", "grads", "optimizer", "total", "predicted"}
        assert r["peak_mem_bytes"]["rss"] > 0 and r["versions"]["torch"]
        assert r["compiled_graphs"] is None  # eager: no --compile (test_bench_compile.py counts the compiled ones)
        # the rank's own record of its huge pages: none for this 12 MiB model, which glibc's heap serves
        # (zero_kit.dist.set_rank_huge_pages), or the user's own value
        assert r["rank_env"][THP_ENV] == os.environ.get(THP_ENV) and r["rank_env"]["OMP_NUM_THREADS"]


# ZeRO-1/2 (one optimizer, stage_1_and_2.py) with gradient accumulation on DeepSpeed before 0.19.8 (measured alike
# on 0.18.3, 0.18.4, 0.18.6 and 0.19.0; 0.19.8 matches DDP within 1e-5): the first update agrees with DDP to ~2e-7,
# i.e. rounding, and Adam amplifies that rounding over the following updates (~6e-4 by step 6, 4e-3 by step 20). The accumulation bug before 0.18.3
# (deepspeedai/DeepSpeed#7718, why setup.py starts at 0.18.3) is 4.4e-3 off already at the first update, so the
# first update stays held to 1e-5 on every release.
ZERO2_ROUNDING_BEFORE = "0.19.8"
ZERO2_ROUNDING_BOUND = 1e-2


def _zero2_rounds_unlike_ddp(records) -> bool:
    from packaging.version import Version

    return Version(records["zero2"]["versions"]["deepspeed"]) < Version(ZERO2_ROUNDING_BEFORE)


def test_fp32_losses_match_ddp_within_1e_5_over_20_steps(records):
    ddp = records["ddp"]["losses"]
    assert ddp[-1] < ddp[0] - 0.05  # the model really trains, so agreement is not trivial
    for name in ("fsdp", "zero1", "zero2", "zero2_sp2", "zero3_release", SP, USER):
        diffs = [abs(a - b) for a, b in zip(records[name]["losses"], ddp, strict=True)]
        if name in ZERO12 and _zero2_rounds_unlike_ddp(records):
            assert max(diffs[:2]) <= 1e-5, f"{name}'s first update differs from ddp's by {diffs[1]}: not rounding"
            assert max(diffs) <= ZERO2_ROUNDING_BOUND, f"{name} differs from ddp by {max(diffs)}"
            print(f"\n{name} on DeepSpeed < {ZERO2_ROUNDING_BEFORE}: max |loss - ddp| {max(diffs):.2e}")
            continue
        assert max(diffs) <= 1e-5, f"{name} differs from ddp by {max(diffs)}"
        assert records[name]["loss_parity"] is True


def _state(records, name):
    return records[name]["model_state_bytes_per_rank"], records[name]["model"]["n_params"]


# fp32 AdamW, bytes per parameter, as (replicated, partitioned over N). ZeRO-3 (2 ranks, DeepSpeed 0.19.8, client
# torch AdamW like the benchmark or the config AdamW: the same storages), every live storage >= 64 B after a step,
# listed by owner with `benchmarks.state_bytes.run --list-storages`:
#   model states: param partition (ds_tensor views of fp16_partitioned_groups_flat) 4/N, grad_partitions_flat_buffer
#   4/N, fp32_partitioned_groups_flat 4/N (a separate copy: `_create_fp32_partitions` reuses the param partition
#   only when `tensor.device == self.device`, and self.device is the string "cpu"/"cuda:0", never equal to a
#   torch.device), exp_avg 4/N, exp_avg_sq 4/N = 20/N;
#   working buffers (the planner's buffers, not counted here): ipg bucket reduce_bucket_size x 4 B, persistent
#   (gathered) small params.
FP32_COEFFICIENTS = {"ddp": (16, 0), "fsdp": (0, 16), "zero1": (4, 16), "zero2": (4, 16), "zero3_release": (0, 20),
                     "zero2_sp2": (4, 16), SP: (0, 20), USER: (4, 16)}  # fmt: skip
PLANNER_NAME = {
    "zero3_release": "zero3",
    SP: "zero3",
    "zero2_sp2": "zero2",
    USER: "zero2",
}  # the states, another schedule
ZERO12 = ("zero1", "zero2", "zero2_sp2", USER)


@pytest.mark.parametrize("name", RUNS)
def test_measured_state_bytes_match_fp32_accounting_within_1_percent(records, name):
    state, n = _state(records, name)
    replicated, partitioned = FP32_COEFFICIENTS[name]
    for rank_state in state["all_ranks"]:
        assert rank_state["total"] == pytest.approx(replicated * n + partitioned * n / 2, rel=0.01)


@pytest.mark.parametrize("name", RUNS)
def test_planner_model_state_bytes_match_the_measured_run(records, name):
    # Issue 5: `zero-kit plan`'s table (accounting.model_state_bytes) against this run's bytes on every rank: totals
    # within 1% (the issue-4 target; issue 5 asks 5%), each part within 5%. Rank 0 of ZeRO-1/2 holds the whole
    # gradient of the parameter straddling the partition boundary (+4.7% grads here, one hidden x hidden matrix).
    state, n = _state(records, name)
    planned = model_state_bytes(PLANNER_NAME.get(name, name), n, records[name]["world_size"], "fp32")
    # the table in results.jsonl uses the same formula, plus ZeRO-1/2's whole edge-parameter gradients per rank
    numels = records[name]["model"]["param_numels"]
    edges = zero12_edge_grad_bytes(numels, 2, "fp32") if name in ZERO12 else [0, 0]
    assert state["predicted"]["all_ranks_total"] == [planned.total + e for e in edges]
    for rank_state in state["all_ranks"]:
        assert rank_state["total"] == pytest.approx(planned.total, rel=0.01), (name, planned.formula, rank_state)
        for part in ("params", "grads", "optimizer"):
            assert rank_state[part] == pytest.approx(getattr(planned, part), rel=0.05), (name, part, rank_state)


def test_comm_bytes_ratios_against_ddp(records):
    ring = {n: r["comm_bytes_per_step"]["ring_bytes_sent_per_rank"] for n, r in records.items()}
    psi = records["ddp"]["model"]["n_params"] * PSI_BYTES_FP32
    accum = records["ddp"]["batch"]["grad_accum"]
    assert accum == 2
    # DDP: no_sync defers the all-reduce to the last micro step, so one all-reduce of every gradient: 2(N-1)/N * 4Ψ.
    assert ring["ddp"] == pytest.approx(psi, rel=0.01)
    # DeepSpeed reduces whole buckets with all-reduce (use_multi_rank_bucket_allreduce: 1.0 x DDP per reduction),
    # then all-gathers the updated partitions once (0.5). ZeRO-1 keeps full gradients and reduces once, at the
    # boundary: 1.5. ZeRO-2 keeps only a gradient partition, so it must reduce in *every* micro step:
    # accum * 1.0 + 0.5 (1.5 at accum 1).
    assert ring["zero1"] / ring["ddp"] == pytest.approx(1.5, abs=0.05)
    assert ring["zero2"] / ring["ddp"] == pytest.approx(accum * 1.0 + 0.5, abs=0.05)
    assert ring[USER] / ring["ddp"] == pytest.approx(accum * 1.0 + 0.5, abs=0.05)  # the same ZeRO-2
    assert records["zero2"]["comm_bytes_per_step"]["payload_bytes_by_op"]["all_reduce"] >= accum * psi
    # ZeRO-3 with parameters released after forward: all-gather (fwd) + all-gather (bwd) + reduce-scatter per micro
    # step, 1.5 x DDP per micro step as in the paper. (The generator's default zero3 keeps gathered parameters
    # alive from forward to backward: 1.0 per micro step, see benchmarks/compare_cpu/README.md.)
    assert ring["zero3_release"] / ring["ddp"] / accum == pytest.approx(1.5, abs=0.05)


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3_release", USER])
def test_counter_agrees_with_deepspeeds_own_comms_logger(records, name):
    # DeepSpeed's comms logger (switched on exactly while the counter counts) sees the same collectives: same
    # calls and, once its shard-sized gather messages are scaled to the full collective, the same bytes.
    ours = records[name]["comm_bytes_per_step"]
    theirs = records[name]["deepspeed_comms_logger_per_step"]
    assert set(theirs) == set(ours["calls_by_op"]), (theirs, ours)
    for op, seen in theirs.items():
        assert seen["calls"] == ours["calls_by_op"][op], op
        assert seen["payload_bytes"] == ours["payload_bytes_by_op"][op], op
    assert records["ddp"]["deepspeed_comms_logger_per_step"] is None  # DeepSpeed's logger only sees ZeRO runs


PHASES = ("forward", "backward", "reduction", "step", "gather", "alltoall", "other")


@pytest.mark.parametrize("name", RUNS)
def test_every_strategy_splits_its_step_into_phases_that_add_up(records, name):
    # Issue 36: forward, backward, reduction, optimizer step, gather and the rest, measured the same way for every
    # strategy (zero_kit.bench.phases). Each timed step's split adds up to that step; the record's phases (means over
    # the middle half of the timed steps) to those steps' mean, which a loaded machine may put a few % off the median
    # step (zero2: 41.5 ms against a 39.5 ms median once), so the median is only a loose check.
    r = records[name]
    phases = r["phases_ms"]
    assert tuple(phases) == PHASES and all(v is not None and v >= 0 for v in phases.values()), phases
    timed = r["step_times_s"][r["warmup"] :]
    middle = statistics.fmean(timed[i] for i in r["phases_timed_steps"])
    assert sum(phases.values()) == pytest.approx(1e3 * middle, rel=1e-6), phases
    assert sum(phases.values()) == pytest.approx(1e3 * r["step_time_s"], rel=0.25), phases
    assert len(r["phases_by_step_ms"]) == len(timed) and len(r["phases_timed_steps"]) >= len(timed) // 2
    for split, seconds in zip(r["phases_by_step_ms"], timed, strict=True):
        assert min(split.values()) >= -0.01, split  # ms; "other" only for clock jitter
        assert sum(split.values()) == pytest.approx(1e3 * seconds, rel=1e-6)
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["step"] > 0
    assert len(r["phases_ms_by_rank"]) == 2
    # every data-parallel strategy here reduces gradients with a blocking or waited collective
    assert phases["reduction"] > 0
    windows = r["phase_windows_ms"]
    if name == "ddp":  # DDP's bucket all-reduces: issued in backward, what was not hidden waited for at its end
        assert windows["backward"]["reduction"] > 0 and phases["gather"] < 0.5, windows
    if name == "zero3_release":  # parameters gathered in forward and again in backward
        assert windows["forward"]["gather"] > 0 and windows["backward"]["gather"] > 0, windows
    if name in ZERO12:  # the updated partitions all-gathered in the optimizer step
        assert windows["step"]["gather"] > 0, windows
    if name in SP_ROWS:  # Ulysses' head exchanges: in every layer's forward and backward, nowhere else
        assert windows["forward"]["alltoall"] > 0 and windows["backward"]["alltoall"] > 0, windows
        assert windows["step"]["alltoall"] == 0, windows
    else:
        assert phases["alltoall"] == 0, phases


def test_the_sequence_parallel_row_trains_the_same_rows_split_over_its_group(records, bench_out):
    # Issue 48 (`zero-kit bench --sp`): the group of 2 ranks trains the global batch of its sp=1 twin, two rows at
    # a time in twice the micro steps, each rank on half of every row; the same losses (fp32, within 1e-5: the
    # parity test above holds it to DDP's too).
    r, twin = records[SP], records["zero3_release"]
    assert r["parallel"] == {"tensor": 1, "pipeline": 1, "sequence": 2, "data": 1}
    assert r["batch"] == {"micro": 2, "grad_accum": 4, "sequence_parallel": 2, "global": 8}
    assert twin["batch"]["global"] == 8 and twin["parallel"]["data"] == 2
    assert r["vs_sp1"]["strategy"] == "zero3_release" and r["vs_sp1"]["loss_parity"] is True
    assert r["vs_sp1"]["max_abs_loss_diff"] <= 1e-5 and r["vs_sp1"]["tokens_per_s_ratio"] > 0
    # The all-to-alls are exactly the planner's (plan.traffic.ulysses: q, k, v and the output, each layer, forward
    # and backward), per micro step.
    comm = r["comm_bytes_per_step"]
    (planned,) = ulysses(replace(from_record(r), sp=2))
    assert comm["payload_bytes_by_op"]["all_to_all_single"] == r["batch"]["grad_accum"] * planned.payload
    assert comm["calls_by_op"]["all_to_all_single"] == r["batch"]["grad_accum"] * planned.calls
    assert "all_to_all_single" not in twin["comm_bytes_per_step"]["calls_by_op"]
    table = (bench_out / "table.md").read_text()
    assert f"{SP}: Ulysses, 2 ranks per row x data 1; each rank holds 16 of a row's 32 tokens, in 4 micro" in table
    assert "against zero3_release: loss the same" in table


@pytest.mark.parametrize("name", SP_ROWS)
def test_the_sequence_parallel_rows_gradient_norm_is_its_twins(records, name):
    # Gradient clipping and the logged grad_norm read DeepSpeed's global norm. ZeRO-2 under Ulysses on DeepSpeed
    # 0.19.6+ reduces the group loss's gradient to sp x its value (the norm measured 2.0x that of zero2 before
    # lint.installed.ulysses_gradient_scale), ZeRO-3 and 0.18.3 to the value itself: every step's norm is the twin's.
    # ZeRO-2 on DeepSpeed < 0.19.8 rounds its accumulation otherwise than DeepSpeed 0.19.8 (the parity test above):
    # there the first step, before any update, is held exactly and the rest to that rounding.
    r, twin = records[name], records[SP_SUFFIX.match(name)["base"]]
    ours, theirs = r["grad_norms"], twin["grad_norms"]
    assert len(ours) == len(theirs) == 20 and all(n and n > 0 for n in ours + theirs), (ours, theirs)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5)
    rounding = name == "zero2_sp2" and _zero2_rounds_unlike_ddp(records)
    assert ours == pytest.approx(theirs, rel=ZERO2_ROUNDING_BOUND if rounding else 1e-5), (ours, theirs)
    assert r["vs_sp1"]["grad_norm_ratio"] == pytest.approx(1, abs=ZERO2_ROUNDING_BOUND if rounding else 1e-5)


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3_release", USER])
def test_deepspeeds_own_timers_agree_with_the_phases(records, name):
    # wall_clock_breakdown (the bench's DeepSpeed config only): DeepSpeed's fwd / bwd / step timers cover the same
    # calls as the bench's windows (collectives included), averaged over the same steps. bwd and step also hold the
    # accumulation micro step's engine.step(), which the bench counts in backward; both are small here.
    r = records[name]
    timers, windows = r["ds_timers_ms"], r["phase_windows_ms"]
    assert {"fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"} <= set(timers), timers
    ours = windows["forward"]["wall"] + windows["backward"]["wall"] + windows["step"]["wall"]
    theirs = timers["fwd"] + timers["bwd"] + timers["step"]
    assert theirs == pytest.approx(ours, rel=0.25), (timers, windows)
    assert timers["bwd_allreduce"] > 0
    assert records["ddp"]["ds_timers_ms"] is None and records["fsdp"]["ds_timers_ms"] is None


def _parity_word() -> str:
    """DeepSpeed 0.18.3 (the compatibility job's) steps the file's own AdamW section (torch's, built by DeepSpeed)
    4.0e-3 away from DDP over 20 steps, 0.19.8 within 1e-5: the ds_config row's parity column says which."""
    return "yes" if Version(version("deepspeed")) >= Version("0.19") else "NO"


def test_the_docs_rows_are_the_tables(bench_out):
    """docs/comparing.md's two rows (DDP's and the own config's) are this table's, figures free: the same columns,
    precision, layout, formulas and parity verdicts (the sample is DeepSpeed 0.19.8's; 0.18.3 says NO)."""
    ddp_row, own_row = docs.covered("bench-rows").text.strip().splitlines()
    sample = f"{ddp_row}\n{own_row.replace('| yes (', f'| {_parity_word()} (')}\n"
    table = (bench_out / "table.md").read_text()
    assert docs.missing_lines(sample, table, shape=True) == [], table


def test_the_user_config_ran_as_written_but_for_the_batch_and_is_recorded_by_its_stage(records, bench_out, user_file):
    # Issue 36: the record keeps the file and the config that ran (the bench's batch keys, its switches, torch's
    # fused AdamW on CPU), and the report predicts from the file's stage; --report re-renders without the file.
    entry = records[USER]["ds_config"]
    assert entry["file"] == str(user_file) and (entry["stage"], entry["offload_optimizer"]) == (2, False)
    ran, written = entry["config"], json.loads(user_file.read_text())
    assert (ran["train_micro_batch_size_per_gpu"], ran["gradient_accumulation_steps"]) == (2, 2)
    assert "train_batch_size" not in ran and ran["wall_clock_breakdown"] is True
    assert ran["optimizer"]["params"] == {**written["optimizer"]["params"], "torch_adam": True, "fused": True}
    assert ran["zero_optimization"] == written["zero_optimization"] and ran["gradient_clipping"] == 1.0
    assert entry["differs_from_bench"] == [] and records[USER]["same_arithmetic_as_ddp"]
    assert any(change.startswith("train_batch_size 42 dropped") for change in entry["changes"])
    assert records[USER]["batch"] == records["zero2"]["batch"] and records[USER]["parallel"]["data"] == 2
    predicted = records[USER]["model_state_bytes_per_rank"]["predicted"]
    assert predicted == records["zero2"]["model_state_bytes_per_rank"]["predicted"]
    user_file.unlink()
    assert main(["bench", "--report", str(bench_out)]) == 0
    table = (bench_out / "table.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith(f"| {USER} |"))
    parity = _parity_word()  # the arithmetic is the same either way
    assert predicted["formula"] in row
    assert row.endswith(f"| {parity} ({records[USER]['max_abs_loss_diff_vs_ddp']:.1e}) |"), row
    assert f"{USER}: {user_file} (ZeRO-2), run as written except: train_micro_batch_size_per_gpu 7 -> 2" in table

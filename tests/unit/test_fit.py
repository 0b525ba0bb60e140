"""A run that cannot fit never starts (issue 40): --max-length against the model's positions, the planner's peak
against the host's RAM (ZERO_KIT_HOST_MEM_BYTES, a real RLIMIT_AS cap) and a GPU's free memory, the cheapest fix
that passes the same check, and an out-of-memory in a rank named in one line. The refusals go through the real
command line and must come within 5 s, before any launch, data preparation or model load."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from zero_kit.errors import UserError
from zero_kit.metrics import GIB
from zero_kit.train.guards import fit, oom
from zero_kit.train.options import TrainOptions

REFUSED_WITHIN_S = 5.0
"""The length refusal (an input check, no heavy import): issue 30's bound for input errors."""
PLANNED_WITHIN_S = 60.0
"""The memory refusal imports torch and transformers for the plan (about 3 s on a quiet 2-core machine, 13 s in CI
beside the op builds): a bound against a hang or a launch, not a speed target."""


def _train(args: list[str], tmp_path: Path, env: dict[str, str] | None = None, preexec=None):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "zero_kit.cli", "train", "--output", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
                          preexec_fn=preexec)  # fmt: skip
    return done, time.monotonic() - started


def _refused(done: subprocess.CompletedProcess, seconds: float, *, planned: bool = False) -> str:
    """Refused with one error line and its fix, nothing launched; `planned`: by the memory check, which comes after
    the data are prepared (cached for the next run)."""
    within_s = PLANNED_WITHIN_S if planned else REFUSED_WITHIN_S
    assert done.returncode == 2, done.stderr
    assert seconds < within_s, f"refused after {seconds:.1f} s"
    print(f"refused after {seconds:.1f} s")
    assert "Traceback" not in done.stderr + done.stdout
    assert "launching" not in done.stdout and "[rank" not in done.stdout + done.stderr  # no rank started
    assert planned or "data:" not in done.stderr  # an input check: nothing prepared either
    error = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and "\n  fix: " in done.stderr, done.stderr
    return done.stderr


def test_a_length_typo_is_refused_in_seconds(tmp_path):
    done, seconds = _train(["--max-length", "100000", "--pack", "--max-steps", "2"], tmp_path)
    said = _refused(done, seconds)
    assert "--max-length 100000" in said and "max_position_embeddings 512" in said
    assert "fix: pass --max-length 512 or less" in said
    assert not (tmp_path / "out").exists()


def _model_dir(tmp_path: Path, **config) -> str:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return str(directory)


def test_rope_scaling_that_covers_the_length_is_a_warning(tmp_path):
    model = _model_dir(tmp_path, max_position_embeddings=512, rope_scaling={"type": "linear", "factor": 4.0})
    warning = fit.check_length(TrainOptions(model=model, max_length=2048))
    assert "--max-length 2048" in warning and "covers 2048 (linear scaling: 512 x 4)" in warning
    assert fit.check_length(TrainOptions(model=model, max_length=512)) is None
    with pytest.raises(UserError) as refused:
        fit.check_length(TrainOptions(model=model, max_length=4096))
    assert "max_position_embeddings 512 (its RoPE scaling covers 2048" in refused.value.message
    assert "--max-length 2048 or less" in refused.value.fix


def test_llama3_scaling_counts_the_stretched_context():
    config = {"max_position_embeddings": 131072,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}  # fmt: skip
    assert fit.positions(config)[:2] == (131072, 131072)
    assert fit.positions({"max_position_embeddings": 4096, "rope_scaling": None}) == (4096, None, "")


def _plan(opts: TrainOptions):
    """The run of `opts` planned on this CPU host, as `zero-kit train` plans it before any launch."""
    from zero_kit.train.plan import Host, plan_run

    return plan_run(opts, {}, Host(on_gpu=False, bf16_supported=False))


def _need(opts: TrainOptions) -> int:
    """The planned peak of `opts` on this host, all its ranks."""
    return fit.rank_peak(fit.cpu_view(_plan(opts)), on_gpu=False) * opts.nproc


def test_a_shortfall_of_host_ram_is_refused_with_a_fix_that_passes(tmp_path, monkeypatch):
    # between what micro batch 8 and micro batch 1 plan: a smaller micro batch fits, this one does not
    wanted, smallest = (_need(TrainOptions(nproc=2, micro_batch=m, max_length=512)) for m in (8, 1))
    limit = str((wanted + smallest) // 2)
    args = ["--nproc", "2", "--micro-batch", "8", "--max-length", "512", "--max-steps", "2"]
    done, seconds = _train(args, tmp_path, {fit.HOST_MEM_ENV: limit})
    said = _refused(done, seconds, planned=True)
    shown = f"{int(limit) / GIB:.2f} GiB host RAM"
    assert "does not fit in memory" in said and "x 2 rank(s) on this host" in said and shown in said, said
    fix = said.split("fix: add ")[1].split(" (planned")[0]
    assert "--micro-batch" in fix and "--grad-accum" in fix
    # the suggested flags, through the same check (a dry one: nothing is launched)
    monkeypatch.setenv(fit.HOST_MEM_ENV, limit)
    opts = _with_flags(TrainOptions(nproc=2, micro_batch=8, max_length=512), fix.split())
    assert fit.before_launch(_plan(opts), speak=False).startswith("planned peak")


def _with_flags(opts: TrainOptions, words: list[str]) -> TrainOptions:
    changes: dict = {}
    while words:
        flag = words.pop(0).removeprefix("--").replace("-", "_")
        changes[flag] = True if flag == "activation_checkpointing" else int(words.pop(0))
    return replace(opts, **changes)


def test_a_real_address_space_cap_is_refused(tmp_path):
    # the imports fit; the plan of 16 sequences of 512 tokens per rank does not, that of 1 does
    wanted, smallest = (_need(TrainOptions(nproc=1, micro_batch=m, max_length=512)) for m in (16, 1))
    cap = int(fit.ADDRESS_SPACE_OVERHEAD_GIB * GIB) + (wanted + smallest) // 2

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    args = ["--micro-batch", "16", "--max-length", "512", "--max-steps", "2"]
    done, seconds = _train(args, tmp_path, {fit.HOST_MEM_ENV: ""}, preexec=capped)
    said = _refused(done, seconds, planned=True)
    assert f"RLIMIT_AS (ulimit -v) {cap / GIB:.2f} GiB per rank" in said and "--micro-batch" in said, said


def test_no_memory_check_goes_on(monkeypatch):
    monkeypatch.setenv(fit.HOST_MEM_ENV, str(GIB))
    assert fit.before_launch(_plan(TrainOptions(memory_check=False)), speak=False) is None
    with pytest.raises(UserError, match="--no-memory-check to run anyway"):
        fit.before_launch(_plan(TrainOptions()), speak=False)


def test_the_test_suites_runs_fit_this_host():
    """Up to four ranks of the embedded model: the check must never refuse the suite's own runs on a 24 GiB host."""
    view = fit.cpu_view(_plan(TrainOptions(nproc=4)))
    assert fit.rank_peak(view, on_gpu=False) * 4 < 10 * GIB


def test_within_ten_percent_is_a_warning():
    view = fit.cpu_view(_plan(TrainOptions()))
    need = fit.rank_peak(view, on_gpu=False)
    assert "may not fit" in fit.judge(view, TrainOptions(), False, int(need / 0.95), "host RAM")
    assert fit.judge(view, TrainOptions(), False, need * 2, "host RAM") is None


def test_a_gpu_shortfall_suggests_sharding_or_offload():
    view = replace(fit.cpu_view(_plan(TrainOptions(nproc=2, micro_batch=1))), offload="none")
    need = fit.rank_peak(view, on_gpu=True)
    with pytest.raises(UserError) as refused:
        fit.judge(view, TrainOptions(nproc=2, micro_batch=1), True, int(need * 0.97), "free on cuda:0")
    assert "per GPU" in refused.value.message and refused.value.fix.startswith("add --")
    assert any(flag in refused.value.fix for flag in ("--activation-checkpointing", "--stage 3", "--offload"))


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (the name is what is matched), which needs a GPU to be raised."""


def test_an_out_of_memory_in_a_rank_is_one_line_with_the_plan_and_the_fix():
    with pytest.raises(UserError) as named, oom.out_of_memory_named(int(1.5 * GIB), "--micro-batch 1", lambda: 7):
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    err = named.value
    assert err.exit_code == 1 and err.fix == "--micro-batch 1"
    assert err.message.startswith("out of memory at step 7: planned peak 1.50 GiB, measured peak ")
    assert "\n" not in err.message and err.__cause__ is None and err.__suppress_context__


def test_an_out_of_memory_wrapped_by_a_library_is_named_and_other_errors_pass():
    def step():
        raise AttributeError("no trainer state yet")

    with (
        pytest.raises(UserError, match="out of memory before the first step"),
        oom.out_of_memory_named(None, "x", step),
    ):
        try:
            raise OutOfMemoryError("CUDA out of memory")
        except OutOfMemoryError as inner:
            raise RuntimeError("DeepSpeed step failed") from inner
    with pytest.raises(ValueError), oom.out_of_memory_named(GIB, "x", lambda: 1):
        raise ValueError("not memory")


def test_the_host_refusing_an_allocation_is_named_too():
    for err in (MemoryError(), RuntimeError(f"[enforce fail at alloc_cpu.cpp:117] . {oom.CPU_OUT_OF_MEMORY}: 8 GiB")):
        with pytest.raises(UserError, match="^out of memory at step 2"), oom.out_of_memory_named(GIB, "x", lambda: 2):
            raise err


def test_a_long_sequence_that_does_not_fit_is_offered_sequence_parallelism_and_tiling(tmp_path, monkeypatch):
    """At 16k tokens on 2 CPU ranks, micro batch 1 already: the fix is a long-sequence flag (--sp 2 and/or
    --tiled-compute, issue 48), and the flags it names pass the same check."""
    model = _model_dir(tmp_path, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=32000, max_position_embeddings=16384)  # fmt: skip
    opts = TrainOptions(model=model, nproc=2, micro_batch=1, max_length=16384, activation_checkpointing=True)
    wanted = _need(opts)
    best = min(_need(replace(opts, sp=2, tiled_compute=True)), _need(replace(opts, tiled_compute=True)))
    assert best < 0.6 * wanted
    limit = (wanted + best) // 2
    monkeypatch.setenv(fit.HOST_MEM_ENV, str(limit))
    with pytest.raises(UserError) as refused:
        fit.before_launch(_plan(opts), speak=False)
    fix = refused.value.fix.split("add ")[1].split(" (planned")[0]
    assert "--sp" in fix or "--tiled-compute" in fix, fix
    words = fix.split()
    changes: dict = {}
    while words:
        flag = words.pop(0).removeprefix("--").replace("-", "_")
        changes[flag] = int(words.pop(0)) if flag == "sp" else True
    assert fit.before_launch(_plan(replace(opts, **changes)), speak=False).startswith("planned peak")


CAP_STUDY = {(1, False): (23552, 24832), (2, True): (52224, 55296)}
"""benchmarks/long_sequences' cap study under a 4 GiB `ulimit -v`: (sp, tiled) -> (the longest length that trained,
the next length tried, which failed)."""


@pytest.fixture(scope="module")
def cap_study_model(tmp_path_factory) -> Path:
    """The cap study's model directory, built as the study builds it (benchmarks/long_sequences/cap.py)."""
    from benchmarks.long_sequences.cap import CONTEXT
    from benchmarks.long_sequences.memory import SHAPE
    from benchmarks.plan_rss.run import model_dir

    return model_dir(tmp_path_factory.mktemp("cap_study"), {**SHAPE, "max_position_embeddings": CONTEXT})


@pytest.mark.parametrize(("sp", "tiled"), list(CAP_STUDY))
def test_the_guard_lets_train_what_trained_under_a_cap_and_not_much_more(sp, tiled, cap_study_model):
    """The CPU terms against the measured limits of unpacked rows: the longest length that trained is let through
    (a false refusal costs the user the run), and the guard's own limit is within 15% of it."""
    from benchmarks.long_sequences.cap import planned_longest

    trained, failed = CAP_STUDY[sp, tiled]
    longest = planned_longest(cap_study_model, sp, tiled, 4 * GIB, 256 * sp)
    assert trained * 0.85 <= longest <= trained * 1.15 and longest < failed, (longest, trained)
    assert longest >= trained * 0.94, "refuses a length about as long as one that trained"


def test_the_fix_for_a_rank_capped_run_keeps_whole_sp_groups_and_never_drops_ranks(cap_study_model, monkeypatch):
    """Under `ulimit -v` each rank has its own cap: fewer ranks on the host lift none of it, and under --sp N a rank
    count that is not a multiple of N is no run at all. The out-of-memory report of the cap study's two-rank failure
    said `fix: --nproc 1`; now a flag set that lowers a rank's own peak."""
    from zero_kit.train.plan import Host, plan_run

    opts = TrainOptions(model=str(cap_study_model), max_length=55296, micro_batch=1, stage=3, sp=2, tiled_compute=True,
                        nproc=2, precision="fp32")  # fmt: skip
    view = fit.cpu_view(plan_run(opts, {}, Host(on_gpu=False, bf16_supported=False)))
    assert all(shape.ranks % 2 == 0 for shape in fit.candidates(view, opts, on_gpu=False))
    monkeypatch.setattr(fit, "rank_cap_bytes", lambda cap=None: 4 * GIB)
    _, fix = fit.plan_and_fix(view, opts, on_gpu=False)
    assert "--nproc" not in fix, fix

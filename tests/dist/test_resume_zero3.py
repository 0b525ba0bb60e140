"""ZeRO-3 on two CPU ranks through `zero-kit train --nproc 2` (re-launch under the `deepspeed` launcher):
construction under zero.Init, export with equal logits, and a checkpoint of the run that resumes to bitwise the same
weights as the uninterrupted run. All of it reads the shared two-rank reference run (reliability_helpers.py); the
one launch of its own is the resume. The compatibility job of .ci/run runs this file on the oldest release set: ZeRO-3
train, checkpoint, resume and export there. A SIGTERM (preemption) that saves, exits 75 and resumes to the same
weights is tests/dist/test_reliability.py's tests 3 and 4 (main job)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from reliability_helpers import JOB, STEPS, zero3_reference

from tests.support.jobs import run, zero_kit
from tests.support.runs import (
    assert_bitwise_equal,
    assert_trained,
    log_records,
    pointer,
    resumed_from,
    run_info,
)
from zero_kit.train.startup import STAGES, STARTUP_FILE

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The uninterrupted two-rank run of reliability_helpers.JOB (constant LR: the comparisons are about state, not
    schedule), trained once per test run: test_reliability.py compares with the same run."""
    return zero3_reference(tmp_path_factory)


def test_the_ranks_run_their_parents_plan(uninterrupted):
    """The reference run's ranks fail if they resolve sizes, stage or plan themselves (tests/dist/probe,
    ZERO_KIT_PROBE_NO_REPLAN): it finished, and its record holds the parent's plan."""
    record = json.loads((uninterrupted / "run" / "zero_kit_run.json").read_text())
    assert (record["world_size"], record["zero_stage"], record["precision"]) == (2, 3, "fp32")
    assert "a rank resolved its run again" not in (uninterrupted / "output.txt").read_text()


def test_start_up_is_recorded_by_stage_with_threads_per_rank(uninterrupted):
    """The relaunch's ranks get cores / local ranks threads from zero-kit (accelerate neither sets its own nor warns),
    and rank 0 records the time to first step by stage, printed once."""
    record = json.loads((uninterrupted / "run" / STARTUP_FILE).read_text())
    assert list(record["stages_s"]) == list(STAGES)
    assert all(seconds >= 0 for seconds in record["stages_s"].values())
    assert record["stages_s"]["launch"] > 0  # the parent and its launcher ran before the rank's process started
    assert record["time_to_first_step_s"] == pytest.approx(sum(record["stages_s"].values()), abs=0.01)
    assert record["rss_mib_after"]["data"] > 0 and record["peak_rss_mib"] >= record["rss_mib_after"]["data"]
    assert 0 < record["private_mib_after"]["data"] < record["rss_mib_after"]["data"]
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    assert record["threads"] == {"OMP_NUM_THREADS": str(threads), "torch": threads}
    output = (uninterrupted / "output.txt").read_text()
    assert output.count("zero-kit train: time to first step ") == 1
    assert "OMP_NUM_THREADS" not in output  # neither accelerate's warning nor torchrun's


def test_zero3_model_was_never_whole_on_a_rank(uninterrupted):
    assert_trained(uninterrupted / "run", STEPS, world_size=2, stage=3)
    held = run_info(uninterrupted / "run")["zero3_init"]
    total, per_rank = held["total_parameters"], held["elements_held_per_rank"]
    assert len(per_rank) == 2 and total > 1_000_000
    # zero.Init partitions every parameter as it is created: each rank holds half (+ padding), never the whole.
    assert all(n <= total // 2 + 1024 for n in per_rank), (total, per_rank)


def test_export_matches_in_training_logits_and_generates(uninterrupted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = uninterrupted / "run" / "final"
    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    for name, tensor in model.state_dict().items():
        assert tensor.numel() > 0, name
    probe = torch.load(uninterrupted / "probe.pt")
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"], attention_mask=probe["attention_mask"]).logits
    assert logits.shape == probe["logits"].shape
    assert torch.equal(logits, probe["logits"]), (logits - probe["logits"]).abs().max()
    tokenizer = AutoTokenizer.from_pretrained(final)
    prompt = tokenizer("What does ZeRO stage 3 shard?", return_tensors="pt")
    # min_new_tokens: a better-trained model may end with eos early; the 8 tokens are what is checked here
    out = model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 8
    assert tokenizer.decode(out[0, prompt["input_ids"].shape[1] :]).strip()


def test_checkpoint_resumes_to_bitwise_equal_weights(uninterrupted, tmp_path):
    """The reference run's checkpoint-6, copied (a reader never writes into the shared run), resumed by `--resume
    auto` to the end: the same final weights, bit for bit. (This test preempted a run of its own with SIGTERM and
    resumed it: two launches; the preemption is test_reliability.py's tests 3-4, on the same resume path.)"""
    out, resume_at = tmp_path / "run", STEPS - 2
    out.mkdir()
    shutil.copytree(uninterrupted / "run" / f"checkpoint-{resume_at}", out / f"checkpoint-{resume_at}")
    proc = run(
        zero_kit("train", "--nproc", "2", "--master-port", "29612", "--output", str(out), "--resume", "auto", *JOB)
    )
    assert resumed_from(proc.stdout) == resume_at
    assert [r["step"] for r in log_records(out)] == list(range(resume_at + 1, STEPS + 1))
    assert pointer(out) == f"checkpoint-{STEPS}"
    assert_bitwise_equal(out / "final", uninterrupted / "run" / "final", f"after resume from step {resume_at}")

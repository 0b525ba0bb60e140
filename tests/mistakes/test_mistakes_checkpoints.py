"""Issue 30, the checkpoint cases: zero-kit deletes only what it wrote, checks before it deletes, and refuses a rerun
that does not fit the checkpoint before any rank starts.

One real one-rank `zero-kit train` (2 steps, a checkpoint each) runs once for the module, into an output that
already holds another tool's `checkpoint-500` (case 1, the successful run); each case works on a copy of that
output and compares its snapshot before and after."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.support.jobs import FAST, run, zero_kit
from tests.support.mistakes import FAST_ERROR_S, answer, assert_refused, snapshot
from zero_kit.checkpoints import store


def _foreign_checkpoint(output: Path) -> Path:
    """What an HF Trainer run leaves: trainer_state.json and model.safetensors, no zero-kit mark."""
    path = output / "checkpoint-500"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text('{"global_step": 500}\n')
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A one-rank ZeRO-2 run of 2 steps, a checkpoint at each, into an output holding a foreign checkpoint-500."""
    output = tmp_path_factory.mktemp("trained") / "out"
    foreign = _foreign_checkpoint(output)
    before = snapshot(foreign)
    started = time.monotonic()
    refused = answer("train", "--output", str(output), "--max-steps", "2", "--save-steps", "1", "--no-export", *FAST)
    proc = run(
        zero_kit("train", "--output", str(output), "--max-steps", "2", "--save-steps", "1", "--no-export",
                 "--overwrite-output", *FAST),
        timeout=400,
    )  # fmt: skip
    print(f"\nthe module's one-rank run took {time.monotonic() - started:.1f} s")
    return {
        "output": output,
        "foreign_before": before,
        "stderr": proc.stderr,
        "stdout": proc.stdout,
        "refused": refused,
    }


def test_case0_an_output_holding_another_tools_files_is_refused_without_overwrite_output(trained):
    """Issue 52: a non-empty --output zero-kit did not write is refused before anything happens (its files named)."""
    assert_refused(trained["refused"], "checkpoint-500", "--overwrite-output", code=2)


@pytest.fixture
def output(trained, tmp_path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(trained["output"], copy, symlinks=True)
    return copy


def test_case1_a_successful_run_leaves_a_foreign_checkpoint_alone_and_says_so_once(trained):
    output = trained["output"]
    assert snapshot(output / "checkpoint-500") == trained["foreign_before"]
    assert trained["stderr"].count("checkpoint-500") == 1, trained["stderr"][-3000:]
    assert "not written by zero-kit" in trained["stderr"]
    assert [p.name for p in store.list_checkpoints(output)] == ["checkpoint-1", "checkpoint-2", "checkpoint-500"]
    assert store.newest_complete(output) == output / "checkpoint-2"
    assert not any(output.rglob(store.PARTIAL_MARK)), "the in-progress mark outlived a complete save"


def test_case1_a_data_mistake_deletes_nothing(tmp_path):
    output = tmp_path / "out"
    _foreign_checkpoint(output)
    before = snapshot(output)
    found = answer("train", "--output", str(output), "--data", str(tmp_path / "missing.jsonl"), "--overwrite-output",
                   *FAST)  # fmt: skip
    assert_refused(found, "missing.jsonl", "fix:", code=2)
    assert snapshot(output) == before


def test_case2_resume_never_deletes_nothing_before_the_inputs_passed(output, tmp_path):
    before = snapshot(output)
    found = answer("train", "--output", str(output), "--resume", "never", "--data", str(tmp_path / "missing.jsonl"),
                   *FAST)  # fmt: skip
    assert_refused(found, "missing.jsonl", "fix:", code=2)
    assert "removed" not in found.stderr
    assert snapshot(output) == before


def test_case5_another_stage_and_world_size_is_refused_before_any_rank_starts(output):
    before = snapshot(output)
    found = answer("train", "--output", str(output), "--nproc", "2", "--stage", "3", "--max-steps", "4", *FAST)
    needles = ("checkpoint-2", "ZeRO-2, 1 rank(s)", "ZeRO-3, 2 rank(s)", "--resume never", "--output", "--stage 2")
    assert_refused(found, *needles, code=2, within_s=FAST_ERROR_S)
    assert "launching" not in found.stdout  # no deepspeed launcher, no rank
    assert snapshot(output) == before


def test_export_of_an_output_names_its_newest_complete_checkpoint(output, tmp_path):
    before = snapshot(output)
    found = answer("export", str(output), "--out", str(tmp_path / "hf"))
    assert_refused(found, "not a checkpoint", f"export {output / 'checkpoint-2'}", code=2)
    found = answer("export", str(output / "checkpoint-500"), "--out", str(tmp_path / "hf"))
    assert_refused(found, "incomplete checkpoint", f"export {output / 'checkpoint-2'}", code=2)
    assert snapshot(output) == before and not (tmp_path / "hf").exists()


def test_export_with_no_checkpoint_left_says_how_to_get_one(tmp_path):
    output = tmp_path / "out"
    _foreign_checkpoint(output)
    found = answer("export", str(output / "checkpoint-2"), "--out", str(tmp_path / "hf"))
    assert_refused(found, "no such checkpoint directory", f"zero-kit train --output {output}", code=2)
    assert "latest_complete" not in found.stderr


def test_export_refuses_a_directory_it_did_not_write_without_force(output, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    before = snapshot(taken)
    found = answer("export", str(output / "checkpoint-2"), "--out", str(taken))
    assert_refused(found, f"--out {taken}", "--force", code=2)
    assert snapshot(taken) == before
    found = answer("export", str(output / "checkpoint-2"), "--out", "/proc/nope")
    assert_refused(found, "--out /proc/nope", code=2)

"""Crash-safe checkpoint bookkeeping (zero_kit.train.checkpoint): only complete checkpoints are ever resumed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zero_kit.errors import UserError
from zero_kit.train import checkpoint, resume
from zero_kit.train.options import TrainOptions


def _fake_checkpoint(root: Path, step: int, *, complete: bool) -> Path:
    """zero-kit's checkpoint-N: complete (manifest), or a save cut short (only the in-progress mark)."""
    path = root / f"checkpoint-{step}"
    checkpoint.mark_partial(path)  # what CompleteCheckpointCallback does before the Trainer writes
    (path / f"global_step{step}").mkdir(parents=True)
    (path / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 100)
    (path / "trainer_state.json").write_text("{}")
    if complete:
        checkpoint.write_manifest(path, step=step, world_size=2)
    return path


def _foreign_checkpoint(root: Path, step: int) -> Path:
    """Another tool's checkpoint-N (an HF Trainer run's): no zero-kit mark at all."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "model.safetensors").write_bytes(b"w" * 64)
    return path


def test_newest_complete_skips_a_partial_save(tmp_path):
    _fake_checkpoint(tmp_path, 2, complete=True)
    _fake_checkpoint(tmp_path, 4, complete=False)  # killed mid-save: no manifest
    assert checkpoint.newest_complete(tmp_path) == tmp_path / "checkpoint-2"
    assert (tmp_path / checkpoint.POINTER).read_text().strip() == "checkpoint-2"


def test_truncated_shard_makes_a_checkpoint_incomplete(tmp_path):
    _fake_checkpoint(tmp_path, 2, complete=True)
    newest = _fake_checkpoint(tmp_path, 4, complete=True)
    shard = newest / "global_step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(b"x" * 10)  # a rank's shard cut short after the manifest (disk trouble)
    assert not checkpoint.is_complete(newest)
    assert checkpoint.newest_complete(tmp_path) == tmp_path / "checkpoint-2"


def test_stale_pointer_is_overridden_by_a_newer_complete_checkpoint(tmp_path):
    _fake_checkpoint(tmp_path, 2, complete=True)
    _fake_checkpoint(tmp_path, 6, complete=True)
    (tmp_path / checkpoint.POINTER).write_text("checkpoint-2\n")
    assert checkpoint.newest_complete(tmp_path) == tmp_path / "checkpoint-6"


def test_nothing_to_resume_from(tmp_path):
    assert checkpoint.newest_complete(tmp_path / "missing") is None
    _fake_checkpoint(tmp_path, 3, complete=False)
    assert checkpoint.newest_complete(tmp_path) is None


def test_remove_incomplete_and_rotate(tmp_path):
    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, step, complete=True)
    _fake_checkpoint(tmp_path, 4, complete=False)
    assert [p.name for p in checkpoint.remove_incomplete(tmp_path)] == ["checkpoint-4"]
    assert [p.name for p in checkpoint.rotate(tmp_path, 2)] == ["checkpoint-1"]
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]
    checkpoint.remove_all(tmp_path)
    assert checkpoint.list_checkpoints(tmp_path) == [] and not (tmp_path / checkpoint.POINTER).exists()


def test_atomic_write_leaves_no_temp_files(tmp_path):
    target = tmp_path / "x.json"
    checkpoint.atomic_write_text(target, "one")
    checkpoint.atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_the_in_progress_mark_is_gone_once_complete_and_never_in_the_manifest(tmp_path):
    path = _fake_checkpoint(tmp_path, 2, complete=True)
    assert not (path / checkpoint.PARTIAL_MARK).exists()
    manifest = json.loads((path / checkpoint.MANIFEST).read_text())
    assert checkpoint.PARTIAL_MARK not in manifest["files"] and checkpoint.is_ours(path)


def test_a_foreign_checkpoint_is_never_deleted_nor_resumed(tmp_path):
    _fake_checkpoint(tmp_path, 2, complete=True)
    _fake_checkpoint(tmp_path, 3, complete=True)
    _fake_checkpoint(tmp_path, 4, complete=False)
    other = _foreign_checkpoint(tmp_path, 500)
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    assert checkpoint.foreign(tmp_path) == [other]
    assert checkpoint.newest_complete(tmp_path) == tmp_path / "checkpoint-3"
    assert [p.name for p in checkpoint.remove_incomplete(tmp_path)] == ["checkpoint-4"]
    assert [p.name for p in checkpoint.rotate(tmp_path, 1)] == ["checkpoint-2"]
    assert [p.name for p in checkpoint.remove_all(tmp_path)] == ["checkpoint-3"]
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    with pytest.raises(RuntimeError, match="did not write it"):
        checkpoint._delete_ours(other)


def test_a_deletion_cut_short_stays_ours_and_incomplete(tmp_path):
    path = _fake_checkpoint(tmp_path, 2, complete=True)
    checkpoint.mark_partial(path)  # what _delete_ours does first; killed before the manifest went
    assert checkpoint.is_ours(path) and not checkpoint.is_complete(path)
    assert checkpoint.remove_incomplete(tmp_path) == [path] and not path.exists()


def test_the_callback_marks_before_the_save_and_refuses_a_foreign_directory(tmp_path):
    from types import SimpleNamespace

    from zero_kit.train.callbacks import CompleteCheckpointCallback

    _foreign_checkpoint(tmp_path, 4)
    callback = CompleteCheckpointCallback(tmp_path, 2, {})
    callback.on_train_begin(None, None, None)  # the Trainer's order: train begins, then steps end
    saving = SimpleNamespace(should_save=True)
    callback.on_step_end(None, SimpleNamespace(global_step=2), saving)
    assert (tmp_path / "checkpoint-2" / checkpoint.PARTIAL_MARK).is_file()
    callback.on_step_end(None, SimpleNamespace(global_step=3), SimpleNamespace(should_save=False))
    assert not (tmp_path / "checkpoint-3").exists()
    with pytest.raises(UserError, match="another tool"):
        callback.on_step_end(None, SimpleNamespace(global_step=4), saving)
    assert not (tmp_path / "checkpoint-4" / checkpoint.PARTIAL_MARK).exists()


def _record(ckpt: Path, *, stage: int, world: int, lora_r: int | None = None, precision: str = "fp32") -> None:
    options = {"model": None, "lora_r": lora_r, "precision": "auto"}
    info = {"options": options, "world_size": world, "zero_stage": stage, "precision": precision}
    (ckpt / checkpoint.RUN_INFO).write_text(json.dumps(info))


def test_a_rerun_at_another_stage_is_refused_naming_both_runs_and_the_ways_on(tmp_path):
    ckpt = _fake_checkpoint(tmp_path, 2, complete=True)
    _record(ckpt, stage=2, world=1)
    opts = TrainOptions(output=str(tmp_path), nproc=2, stage=3)
    with pytest.raises(UserError) as err:
        resume.check_before_start(opts, {})
    text = str(err.value) + " " + err.value.fix
    for needle in ("ZeRO-2, 1 rank(s)", "ZeRO-3, 2 rank(s)", "--resume never", "--output", "--stage 2"):
        assert needle in text


def test_a_new_world_size_alone_goes_through_the_universal_checkpoint(tmp_path):
    ckpt = _fake_checkpoint(tmp_path, 2, complete=True)
    _record(ckpt, stage=2, world=1)
    assert resume.check_before_start(TrainOptions(output=str(tmp_path), nproc=2), {}) == ckpt
    assert resume.check_before_start(TrainOptions(output=str(tmp_path), stage=3, resume="never"), {}) is None


@pytest.mark.parametrize(
    ("flags", "needle"),
    [({"lora_r": 8}, "no --lora-r"), ({"model": "/models/other"}, "no --model"), ({"precision": "bf16"}, "fp32")],
)
def test_lora_model_or_precision_changes_are_refused(tmp_path, flags, needle):
    _record(_fake_checkpoint(tmp_path, 2, complete=True), stage=2, world=1)
    with pytest.raises(UserError) as err:
        resume.check_before_start(TrainOptions(output=str(tmp_path), **flags), {})
    assert needle in err.value.fix


def test_world_size_is_resolved_as_the_launch_will(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=4\nb slots=4\n")
    assert resume.planned_world_size(TrainOptions(hostfile=str(hostfile), nproc=2), {}) == 4
    assert resume.planned_world_size(TrainOptions(hostfile=str(hostfile)), {}) == 8
    assert resume.planned_world_size(TrainOptions(nproc=3), {}) == 3
    assert resume.planned_world_size(TrainOptions(nproc=3), {"WORLD_SIZE": "6"}) == 6
    assert resume.planned_world_size(TrainOptions(), {}) == 1


def test_resume_path_must_be_a_complete_zero_kit_checkpoint(tmp_path):
    other = _foreign_checkpoint(tmp_path, 500)
    with pytest.raises(UserError, match="not a complete zero-kit checkpoint"):
        resume.resume_target(TrainOptions(output=str(tmp_path), resume=str(other)))


def test_an_empty_checkpoint_directory_holds_no_work(tmp_path):
    empty = tmp_path / "checkpoint-7"
    empty.mkdir()
    (tmp_path / "checkpoint-8").mkdir()
    (tmp_path / "checkpoint-8" / f".{checkpoint.PARTIAL_MARK}.tmp123").write_text("")  # killed mid-mark
    assert checkpoint.foreign(tmp_path) == []
    assert [p.name for p in checkpoint.remove_incomplete(tmp_path)] == ["checkpoint-7", "checkpoint-8"]


def test_the_callback_judges_foreign_directories_when_training_begins_not_when_built(tmp_path):
    """CI saw it: rank 1 built its callback while rank 0 was deleting a save cut short (rmtree had taken the mark,
    not yet the rest), took that directory for another tool's and refused to save there four steps later."""
    from types import SimpleNamespace

    from zero_kit.train.callbacks import CompleteCheckpointCallback

    half_deleted = tmp_path / "checkpoint-4"
    half_deleted.mkdir()
    (half_deleted / "trainer_state.json").write_text("{}")  # what rmtree had not reached yet; the mark was gone
    callback = CompleteCheckpointCallback(tmp_path, 2, {})
    shutil.rmtree(half_deleted)  # rank 0's deletion ends, then the barrier, then training begins
    callback.on_train_begin(None, None, None)
    callback.on_step_end(None, SimpleNamespace(global_step=4), SimpleNamespace(should_save=True))
    assert (tmp_path / "checkpoint-4" / checkpoint.PARTIAL_MARK).is_file()


def test_a_deletion_renames_first_so_no_one_sees_a_checkpoint_half_deleted(tmp_path, monkeypatch):
    ours = _fake_checkpoint(tmp_path, 2, complete=False)
    seen = []
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(
        checkpoint.shutil,
        "rmtree",
        lambda path, **kw: (seen.append(checkpoint.list_checkpoints(tmp_path)), real_rmtree(path, **kw)),
    )
    assert checkpoint.remove_incomplete(tmp_path) == [ours]
    assert seen == [[]]  # while rmtree ran, no checkpoint-N was there to be judged
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    leftover = tmp_path / f"{checkpoint.DELETING_PREFIX}checkpoint-4.123"  # a removal cut short
    leftover.mkdir()
    (leftover / "shard.pt").write_bytes(b"x")
    checkpoint.remove_incomplete(tmp_path)
    assert not leftover.exists()

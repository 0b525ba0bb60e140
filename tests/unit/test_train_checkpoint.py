"""Crash-safe checkpoint bookkeeping (zero_kit.checkpoints.store): only complete checkpoints are ever resumed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zero_kit.checkpoints import store
from zero_kit.errors import UserError
from zero_kit.train import resume
from zero_kit.train.options import TrainOptions


def _fake_checkpoint(root: Path, step: int, *, complete: bool) -> Path:
    """zero-kit's checkpoint-N: complete (manifest), or a save cut short (only the in-progress mark)."""
    path = root / f"checkpoint-{step}"
    store.mark_partial(path)  # what CompleteCheckpointCallback does before the Trainer writes
    (path / f"global_step{step}").mkdir(parents=True)
    (path / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 100)
    (path / "trainer_state.json").write_text("{}")
    if complete:
        store.write_manifest(path, step=step, world_size=2)
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
    assert store.newest_complete(tmp_path) == tmp_path / "checkpoint-2"
    assert (tmp_path / store.POINTER).read_text().strip() == "checkpoint-2"


def test_truncated_shard_makes_a_checkpoint_incomplete(tmp_path):
    _fake_checkpoint(tmp_path, 2, complete=True)
    newest = _fake_checkpoint(tmp_path, 4, complete=True)
    shard = newest / "global_step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(b"x" * 10)  # a rank's shard cut short after the manifest (disk trouble)
    assert not store.is_complete(newest)
    assert store.newest_complete(tmp_path) == tmp_path / "checkpoint-2"


def test_stale_pointer_is_overridden_by_a_newer_complete_checkpoint(tmp_path):
    _fake_checkpoint(tmp_path, 2, complete=True)
    _fake_checkpoint(tmp_path, 6, complete=True)
    (tmp_path / store.POINTER).write_text("checkpoint-2\n")
    assert store.newest_complete(tmp_path) == tmp_path / "checkpoint-6"


def test_nothing_to_resume_from(tmp_path):
    assert store.newest_complete(tmp_path / "missing") is None
    _fake_checkpoint(tmp_path, 3, complete=False)
    assert store.newest_complete(tmp_path) is None


def test_remove_incomplete_and_rotate(tmp_path):
    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, step, complete=True)
    _fake_checkpoint(tmp_path, 4, complete=False)
    assert [p.name for p in store.remove_incomplete(tmp_path).removed] == ["checkpoint-4"]
    assert [p.name for p in store.rotate(tmp_path, 2).removed] == ["checkpoint-1"]
    assert [p.name for p in store.list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]
    store.remove_all(tmp_path)
    assert store.list_checkpoints(tmp_path) == [] and not (tmp_path / store.POINTER).exists()


def test_atomic_write_leaves_no_temp_files(tmp_path):
    target = tmp_path / "x.json"
    store.atomic_write_text(target, "one")
    store.atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_the_in_progress_mark_is_gone_once_complete_and_never_in_the_manifest(tmp_path):
    path = _fake_checkpoint(tmp_path, 2, complete=True)
    assert not (path / store.PARTIAL_MARK).exists()
    manifest = json.loads((path / store.MANIFEST).read_text())
    assert store.PARTIAL_MARK not in manifest["files"] and store.is_ours(path)


def test_a_foreign_checkpoint_is_never_deleted_nor_resumed(tmp_path):
    _fake_checkpoint(tmp_path, 2, complete=True)
    _fake_checkpoint(tmp_path, 3, complete=True)
    _fake_checkpoint(tmp_path, 4, complete=False)
    other = _foreign_checkpoint(tmp_path, 500)
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    assert store.foreign(tmp_path) == [other]
    assert store.newest_complete(tmp_path) == tmp_path / "checkpoint-3"
    assert [p.name for p in store.remove_incomplete(tmp_path).removed] == ["checkpoint-4"]
    assert [p.name for p in store.rotate(tmp_path, 1).removed] == ["checkpoint-2"]
    assert [p.name for p in store.remove_all(tmp_path).removed] == ["checkpoint-3"]
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    with pytest.raises(RuntimeError, match="did not write it"):
        store._delete_ours(other)


def test_a_deletion_cut_short_stays_ours_and_incomplete(tmp_path):
    path = _fake_checkpoint(tmp_path, 2, complete=True)
    store.mark_partial(path)  # what _delete_ours does first; killed before the manifest went
    assert store.is_ours(path) and not store.is_complete(path)
    assert store.remove_incomplete(tmp_path).removed == [path] and not path.exists()


def test_the_callback_marks_before_the_save_and_refuses_a_foreign_directory(tmp_path):
    from types import SimpleNamespace

    from zero_kit.train.callbacks import CompleteCheckpointCallback

    _foreign_checkpoint(tmp_path, 4)
    callback = CompleteCheckpointCallback(tmp_path, 2, {})
    callback.on_train_begin(None, None, None)  # the Trainer's order: train begins, then steps end
    saving = SimpleNamespace(should_save=True)
    callback.on_step_end(None, SimpleNamespace(global_step=2), saving)
    assert (tmp_path / "checkpoint-2" / store.PARTIAL_MARK).is_file()
    callback.on_step_end(None, SimpleNamespace(global_step=3), SimpleNamespace(should_save=False))
    assert not (tmp_path / "checkpoint-3").exists()
    with pytest.raises(UserError, match="another tool"):
        callback.on_step_end(None, SimpleNamespace(global_step=4), saving)
    assert not (tmp_path / "checkpoint-4" / store.PARTIAL_MARK).exists()


def _record(ckpt: Path, *, stage: int, world: int, lora_r: int | None = None, precision: str = "fp32") -> None:
    options = {"model": None, "lora_r": lora_r, "precision": "auto"}
    info = {"options": options, "world_size": world, "zero_stage": stage, "precision": precision}
    (ckpt / store.RUN_INFO).write_text(json.dumps(info))


def _plan(opts: TrainOptions, gpu: bool = False):
    """The run of `opts` as its starting process plans it (on a CPU host, or one whose GPUs compute in bf16)."""
    from zero_kit.train.plan import Host, plan_run

    return plan_run(opts, {}, Host(on_gpu=gpu, bf16_supported=gpu))


def test_a_rerun_at_another_stage_is_refused_naming_both_runs_and_the_ways_on(tmp_path):
    ckpt = _fake_checkpoint(tmp_path, 2, complete=True)
    _record(ckpt, stage=2, world=1)
    opts = TrainOptions(output=str(tmp_path), nproc=2, stage=3)
    with pytest.raises(UserError) as err:
        resume.check_resume(_plan(opts), speak=True)
    text = str(err.value) + " " + err.value.fix
    for needle in ("ZeRO-2, 1 rank(s)", "ZeRO-3, 2 rank(s)", "--resume never", "--output", "--stage 2"):
        assert needle in text


def test_a_new_world_size_alone_goes_through_the_universal_checkpoint(tmp_path):
    ckpt = _fake_checkpoint(tmp_path, 2, complete=True)
    _record(ckpt, stage=2, world=1)
    plan = _plan(TrainOptions(output=str(tmp_path), nproc=2))
    resume.check_resume(plan, speak=True)
    assert plan.resume_from == str(ckpt) and plan.world_size == 2
    never = _plan(TrainOptions(output=str(tmp_path), stage=3, resume="never"))
    resume.check_resume(never, speak=True)
    assert never.resume_from is None


@pytest.mark.parametrize(
    ("flags", "needle"),
    [({"lora_r": 8}, "no --lora-r"), ({"model": "other"}, "no --model"), ({"precision": "bf16"}, "fp32")],
)
def test_lora_model_or_precision_changes_are_refused(tmp_path, flags, needle):
    from zero_kit.model import tiny_llama_config

    _record(_fake_checkpoint(tmp_path, 2, complete=True), stage=2, world=1)
    if "model" in flags:  # another model directory: its config is all the plan reads
        other = tmp_path.parent / f"{tmp_path.name}-other"
        other.mkdir()
        (other / "config.json").write_text(json.dumps(tiny_llama_config().to_dict()))
        flags = {"model": str(other)}
    with pytest.raises(UserError) as err:
        resume.check_resume(_plan(TrainOptions(output=str(tmp_path), **flags), gpu="precision" in flags), speak=True)
    assert needle in err.value.fix


def test_resume_path_must_be_a_complete_zero_kit_checkpoint(tmp_path):
    other = _foreign_checkpoint(tmp_path, 500)
    with pytest.raises(UserError, match="not a complete zero-kit checkpoint"):
        resume.resume_target(TrainOptions(output=str(tmp_path), resume=str(other)))


def test_an_empty_checkpoint_directory_holds_no_work(tmp_path):
    empty = tmp_path / "checkpoint-7"
    empty.mkdir()
    (tmp_path / "checkpoint-8").mkdir()
    (tmp_path / "checkpoint-8" / f".{store.PARTIAL_MARK}.tmp123").write_text("")  # killed mid-mark
    assert store.foreign(tmp_path) == []
    assert [p.name for p in store.remove_incomplete(tmp_path).removed] == ["checkpoint-7", "checkpoint-8"]


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
    assert (tmp_path / "checkpoint-4" / store.PARTIAL_MARK).is_file()


def test_a_deletion_renames_first_so_no_one_sees_a_checkpoint_half_deleted(tmp_path, monkeypatch):
    ours = _fake_checkpoint(tmp_path, 2, complete=False)
    seen = []
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(
        store.shutil,
        "rmtree",
        lambda path, **kw: (seen.append(store.list_checkpoints(tmp_path)), real_rmtree(path, **kw)),
    )
    assert store.remove_incomplete(tmp_path).removed == [ours]
    assert seen == [[]]  # while rmtree ran, no checkpoint-N was there to be judged
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    leftover = tmp_path / f"{store.DELETING_PREFIX}checkpoint-4.123"  # a removal cut short
    leftover.mkdir()
    (leftover / "shard.pt").write_bytes(b"x")
    store.remove_incomplete(tmp_path)
    assert not leftover.exists()

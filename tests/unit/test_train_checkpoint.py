"""Crash-safe checkpoint bookkeeping (zero_kit.train.checkpoint): only complete checkpoints are ever resumed."""

from __future__ import annotations

from pathlib import Path

from zero_kit.train import checkpoint


def _fake_checkpoint(root: Path, step: int, *, complete: bool) -> Path:
    path = root / f"checkpoint-{step}"
    (path / f"global_step{step}").mkdir(parents=True)
    (path / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 100)
    (path / "trainer_state.json").write_text("{}")
    if complete:
        checkpoint.write_manifest(path, step=step, world_size=2)
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

"""Issue 52: zero-kit deletes and overwrites only what it wrote. An --output holding a user's files is refused before
anything happens (zero_kit.train.guards.output); rotation and --resume never remove zero-kit's files only
(zero_kit.checkpoints.store); a damaged checkpoint is never deleted and never resumed; a finished --max-steps run
started again trains nothing."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.mistakes import snapshot
from zero_kit.checkpoints import store
from zero_kit.errors import UserError
from zero_kit.export.checks import EXPORT_MARK
from zero_kit.train import resume
from zero_kit.train.guards import output as owned
from zero_kit.train.options import TrainOptions


def _checkpoint(root: Path, step: int) -> Path:
    """A complete zero-kit checkpoint-N, as CompleteCheckpointCallback leaves it."""
    path = root / f"checkpoint-{step}"
    store.mark_partial(path)
    (path / f"global_step{step}").mkdir()
    (path / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 100)
    (path / "trainer_state.json").write_text("{}")
    store.write_manifest(path, step=step, world_size=1)
    return path


def _refusal(output: Path, **options) -> UserError | None:
    try:
        owned.check_output_is_ours(TrainOptions(output=str(output), **options))
    except UserError as err:
        return err
    return None


def test_a_users_files_in_output_are_refused_naming_them_and_the_flag(tmp_path):
    """The issue's case: a user's final/model.safetensors and zero_kit_run.yaml were replaced with exit 0."""
    output = tmp_path / "out"
    (output / "final").mkdir(parents=True)
    (output / "final" / "model.safetensors").write_bytes(b"mine")
    (output / "zero_kit_run.yaml").write_text("mine: true\n")
    before = snapshot(output)
    err = _refusal(output)
    assert err is not None and "final/model.safetensors" in err.message and "zero_kit_run.yaml" in err.message
    assert "--overwrite-output" in err.fix and "nothing was changed" in err.message
    assert _refusal(output, overwrite_output=True) is None
    assert snapshot(output) == before


def test_a_new_empty_or_own_output_is_the_runs(tmp_path):
    assert _refusal(tmp_path / "new") is None
    (tmp_path / "empty").mkdir()
    assert _refusal(tmp_path / "empty") is None
    ours = tmp_path / "ours"
    _checkpoint(ours, 2)
    owned.mark(ours)
    (ours / "final").mkdir()
    (ours / "final" / EXPORT_MARK).write_text("")
    (ours / "final" / "model.safetensors").write_bytes(b"exported")
    (ours / "notes.txt").write_text("a user's note beside the run: never written or deleted\n")
    assert _refusal(ours) is None


def test_a_final_dir_no_export_wrote_is_refused_in_an_own_output(tmp_path):
    output = tmp_path / "out"
    _checkpoint(output, 2)
    owned.mark(output)
    (output / "final").mkdir()
    (output / "final" / "weights.bin").write_bytes(b"mine")
    err = _refusal(output)
    assert err is not None and "final/weights.bin" in err.message


def test_an_unmarked_output_of_an_earlier_release_is_adopted_but_not_zero_kit_names_alone(tmp_path):
    earlier = tmp_path / "earlier"
    _checkpoint(earlier, 2)
    (earlier / store.RUN_INFO).write_text("{}")
    (earlier / "train_log.jsonl").write_text("")
    assert _refusal(earlier) is None
    names_only = tmp_path / "names_only"  # a user's files that happen to bear zero-kit's names: no run's proof
    names_only.mkdir()
    (names_only / "train_log.jsonl").write_text('{"mine": 1}\n')
    err = _refusal(names_only)
    assert err is not None and "train_log.jsonl" in err.message


def test_a_refusal_names_a_few_files_and_counts_the_rest(tmp_path):
    for index in range(8):
        (tmp_path / f"file{index}.txt").write_text("")
    err = _refusal(tmp_path)
    assert "file0.txt, file1.txt, file2.txt, file3.txt, file4.txt and 3 more" in err.message


def test_rotation_and_resume_never_remove_only_zero_kits_files(tmp_path):
    """The issue's case: a user's file inside checkpoint-4 was deleted by --resume never with the folder."""
    one, two, three = (_checkpoint(tmp_path, step) for step in (1, 2, 3))
    (one / "my_eval.txt").write_text("mine\n")
    done = store.rotate(tmp_path, 2)
    assert done.removed == [] and [path for path, _ in done.kept] == [one]
    assert "my_eval.txt" in done.kept_lines()[0]
    assert sorted(p.name for p in one.rglob("*")) == ["my_eval.txt"], "only the user's file is left"
    assert store.foreign(tmp_path) == [one] and store.newest_complete(tmp_path) == three
    (three / "global_step3" / "notes.md").write_text("mine, nested\n")
    done = store.remove_all(tmp_path)
    assert done.removed == [two] and [path for path, _ in done.kept] == [three]
    assert sorted(str(p.relative_to(three)) for p in three.rglob("*")) == ["global_step3", "global_step3/notes.md"]
    assert "removed earlier checkpoints checkpoint-2 from" in done.lines("removed earlier checkpoints", tmp_path)[0]


def test_a_removal_cut_short_is_finished_without_touching_the_users_file(tmp_path):
    path = _checkpoint(tmp_path, 2)
    (path / "mine.txt").write_text("mine\n")
    (path / store.MANIFEST).rename(path / store.REMOVING)  # killed right after the first step of the removal
    assert not store.is_complete(path) and store.is_ours(path)
    store.remove_incomplete(tmp_path)
    assert sorted(p.name for p in path.rglob("*")) == ["mine.txt"]


def test_a_damaged_checkpoint_is_never_deleted_nor_resumed(tmp_path):
    """The issue's case: a checkpoint with its marker but a shard missing was taken for a save cut short and
    deleted, and the run started fresh; it was the user's only checkpoint."""
    sound = _checkpoint(tmp_path, 2)
    damaged = _checkpoint(tmp_path, 4)
    shard = damaged / "global_step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.unlink()
    before = snapshot(damaged)
    assert store.damage(damaged) == "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt is missing"
    assert store.remove_incomplete(tmp_path).removed == []
    with pytest.raises(UserError) as raised:
        resume.resume_target(TrainOptions(output=str(tmp_path), resume="auto"))
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt is missing" in raised.value.message
    assert f"--resume {sound}" in raised.value.fix
    done = store.remove_all(tmp_path)
    assert done.removed == [sound] and done.kept == [(damaged, f"damaged: {store.damage(damaged)}")]
    assert snapshot(damaged) == before


def test_only_the_damaged_checkpoint_offers_a_fresh_start(tmp_path):
    damaged = _checkpoint(tmp_path, 4)
    (damaged / "trainer_state.json").write_text("{}, cut")
    with pytest.raises(UserError) as raised:
        resume.resume_target(TrainOptions(output=str(tmp_path), resume="auto"))
    assert "has 7 bytes, its manifest says 2" in raised.value.message and "--resume never" in raised.value.fix


@pytest.mark.parametrize(("step", "max_steps", "done"), [(3, 3, True), (4, 3, True), (2, 3, False), (3, None, False)])
def test_a_run_whose_max_steps_is_reached_trains_nothing(tmp_path, capsys, step, max_steps, done):
    """Issue 53: `--max-steps 3` run twice trained step 4/3 and replaced final/."""
    ckpt = _checkpoint(tmp_path, step)
    _export(tmp_path)
    plan = SimpleNamespace(options=TrainOptions(output=str(tmp_path), max_steps=max_steps), resume_from=str(ckpt),
                           output=tmp_path)  # fmt: skip
    assert resume.already_done(plan, speak=True) is done
    said = capsys.readouterr().out
    assert (
        f"already reached --max-steps {max_steps}: nothing to train, {tmp_path / 'final'} left as it is" in said
    ) is done
    fresh = SimpleNamespace(options=plan.options, resume_from=None, output=tmp_path)
    assert resume.already_done(fresh, speak=True) is False


def _export(output: Path) -> None:
    """A finished export of the output's checkpoint: the mark, and the tokenizer written last."""
    (output / "final").mkdir()
    (output / "final" / EXPORT_MARK).write_text("")
    (output / "final" / "tokenizer_config.json").write_text("{}")


def test_an_export_a_ctrl_c_cut_short_is_finished_instead(tmp_path, capsys, monkeypatch):
    """Ctrl-C during the final export, then the printed `--resume auto`: nothing to train, but final/ is written."""
    import os

    import zero_kit.export

    ckpt = _checkpoint(tmp_path, 3)
    _export(tmp_path)
    stamp = (ckpt / store.MANIFEST).stat().st_mtime - 60  # the tokenizer of an earlier export: older than the ckpt
    os.utime(tmp_path / "final" / "tokenizer_config.json", (stamp, stamp))
    exported = []
    monkeypatch.setattr(zero_kit.export, "export_checkpoint", lambda ckpt, out, **kw: exported.append((ckpt, out)))
    plan = SimpleNamespace(options=TrainOptions(output=str(tmp_path), max_steps=3), resume_from=str(ckpt),
                           output=tmp_path)  # fmt: skip
    assert resume.already_done(plan, speak=True) is True
    assert exported == [(ckpt, tmp_path / "final")]
    assert "its export to" in capsys.readouterr().out
    quiet = SimpleNamespace(options=TrainOptions(output=str(tmp_path), max_steps=3, export=False),
                            resume_from=str(ckpt), output=tmp_path)  # fmt: skip
    exported.clear()
    assert resume.already_done(quiet, speak=True) is True and exported == []


def test_the_manifest_lists_what_a_rotation_may_delete(tmp_path):
    path = _checkpoint(tmp_path, 1)
    listed = json.loads((path / store.MANIFEST).read_text())["files"]
    assert set(listed) == {"global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt", "trainer_state.json"}
    assert store.foreign_files(path) == []

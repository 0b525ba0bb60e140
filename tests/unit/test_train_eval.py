"""Evaluation and tracking of `zero-kit train` without a run: the flags' checks (all at once, each with its fix),
the input checks before any work (eval file, a split that leaves nothing to train on, a tracker package that is
not installed), the seeded hold-out, the eval schedule, and --keep-best's rotation and export choice."""

from __future__ import annotations

import json
import math
import sys

import pytest
from transformers import TrainerControl, TrainerState

from zero_kit.checkpoints import store
from zero_kit.data.dataset import IGNORE_INDEX, held_out, tokenize_split
from zero_kit.errors import UserError
from zero_kit.model import load_tokenizer
from zero_kit.train.callbacks import EvalScheduleCallback, PerplexityCallback
from zero_kit.train.guards.inputs import check_inputs
from zero_kit.train.options import TrainOptions, check_options


def _flag_errors(**fields) -> str:
    with pytest.raises(UserError) as err:
        check_options(TrainOptions(**fields))
    return str(err.value)


def test_eval_flag_mistakes_are_reported_together_each_with_a_fix():
    text = _flag_errors(eval_data="e.jsonl", val_size=0.1, eval_steps=0, report_to="tensorboard,wandbb")
    assert "--eval-data and --val-size were both given" in text and "--eval-steps must be >= 1, got 0" in text
    assert "--report-to 'tensorboard,wandbb': unknown wandbb" in text and "tensorboard, wandb, mlflow" in text
    assert text.startswith("3 problems in the flags") and text.count("fix:") == 4  # each, and the summary
    for size in (0.0, 1.0, 1.5):
        assert f"--val-size must be between 0 and 1, got {size:g}" in _flag_errors(val_size=size)
    text = _flag_errors(eval_steps=10, keep_best=True)
    assert "--eval-steps was given without evaluation data" in text and "--keep-best was given without" in text
    assert "drop none" in _flag_errors(report_to="none,mlflow")
    text = _flag_errors(val_size=0.1, keep_best=True)  # a best checkpoint needs checkpoints
    assert "--keep-best was given without --save-steps" in text and "add --save-steps N" in text
    check_options(
        TrainOptions(val_size=0.1, eval_steps=5, save_steps=5, keep_best=True, report_to="tensorboard, mlflow")
    )


def test_input_checks_name_the_eval_file_and_a_split_that_leaves_nothing_to_train(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(3)), encoding="utf-8")
    with pytest.raises(UserError) as err:
        check_inputs(TrainOptions(data=str(data), format="text", eval_data=str(tmp_path / "no.jsonl")), output=False)
    assert str(err.value).count("--eval-data") >= 1 and "no such file" in str(err.value)
    with pytest.raises(UserError) as err:
        check_inputs(TrainOptions(data=str(data), format="text", val_size=0.9), output=False)
    assert "--val-size 0.9 holds out 3 of 3 examples: none is left to train on" in str(err.value)
    check_inputs(TrainOptions(data=str(data), format="text", val_size=0.3, eval_data=None), output=False)


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow"])
def test_a_tracker_whose_package_is_missing_is_one_error_with_the_pip_command(monkeypatch, tracker):
    for name in ("tensorboard", "tensorboardX", "wandb", "mlflow"):
        monkeypatch.setitem(sys.modules, name, None)  # what Python itself takes for "not importable"
    with pytest.raises(UserError) as err:
        check_inputs(TrainOptions(report_to=tracker), output=False)
    assert f"--report-to {tracker}: package not installed (in {sys.executable}): {tracker}" in str(err.value)
    assert f"pip install {tracker}" in str(err.value)
    with pytest.raises(UserError) as err:
        check_inputs(TrainOptions(report_to="mlflow,tensorboard"), output=False)
    assert "pip install mlflow tensorboard," in str(err.value)  # every missing one in one error


def test_held_out_is_fixed_by_the_seed_disjoint_and_in_order():
    train, held = held_out(100, 0.1, seed=0)
    assert (train, held) == held_out(100, 0.1, seed=0) and held != held_out(100, 0.1, seed=1)[1]
    assert len(held) == 10 and sorted(train + held) == list(range(100)) and held == sorted(held)
    assert len(held_out(5, 0.01, seed=0)[1]) == 1  # at least one
    with pytest.raises(UserError, match="none is left to train on"):
        held_out(1, 0.5, seed=0)


def test_the_held_out_part_is_masked_and_packed_as_training_data():
    rows = [{"instruction": f"Say {i}.", "input": "", "output": f"{i} " * (1 + i % 3)} for i in range(20)]
    tokenizer = load_tokenizer(None)
    train, held, stats = tokenize_split(rows, tokenizer, "alpaca", 64, val_size=0.25, seed=3, pack=True)
    assert stats.rows_read == 20 and stats.rows_kept == 15
    for part in (train, held):
        assert set(part.column_names) == {"input_ids", "labels", "attention_mask", "position_ids"}
        assert all(len(ids) == 64 for ids in part["input_ids"])
        # every example's first label is masked (prompt masking and the packing boundary), as in training
        for labels, positions in zip(part["labels"], part["position_ids"], strict=True):
            assert all(labels[i] == IGNORE_INDEX for i, pos in enumerate(positions) if pos == 0)
    plain_train, plain_held, _ = tokenize_split(rows, tokenizer, "alpaca", 64, val_size=0.25, seed=3)
    assert len(plain_held) == 5 and len(plain_train) == 15


def _state(step: int, max_steps: int) -> TrainerState:
    state = TrainerState()
    state.global_step, state.max_steps = step, max_steps
    return state


def test_eval_schedule_last_step_every_save_with_keep_best_not_on_a_stop():
    def decide(step, keep_best=False, save=False, stop=False):
        control = TrainerControl(should_save=save, should_training_stop=stop)
        EvalScheduleCallback(keep_best).on_step_end(None, _state(step, 10), control)
        return control.should_evaluate

    assert decide(10) and not decide(4, save=True) and decide(4, keep_best=True, save=True)
    assert not decide(4, keep_best=True, save=True, stop=True)  # a signal's save: the grace period is for the save
    logs = {"eval_loss": 2.0}
    PerplexityCallback().on_log(None, None, None, logs=logs)
    assert logs["eval_perplexity"] == pytest.approx(math.exp(2.0))


def _complete(out, step: int, eval_loss: float | None) -> None:
    ckpt = out / f"checkpoint-{step}"
    store.mark_partial(ckpt)
    (ckpt / "weights.bin").write_bytes(b"x" * step)
    store.write_manifest(ckpt, step=step, world_size=1, eval_loss=eval_loss)


def test_keep_best_keeps_the_lowest_eval_loss_out_of_rotation(tmp_path):
    for step, loss in ((1, 3.0), (2, 1.5), (3, 2.0), (4, None)):
        _complete(tmp_path, step, loss)
    assert store.best_complete(tmp_path).name == "checkpoint-2"
    removed = store.rotate(tmp_path, 1, keep_best=True).removed
    assert [p.name for p in removed] == ["checkpoint-1", "checkpoint-3"]
    assert [p.name for p in store.list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-4"]
    assert [p.name for p in store.rotate(tmp_path, 1).removed] == ["checkpoint-2"]  # without it: newest only


def test_trackers_see_perplexity_and_tokens_per_second(tmp_path):
    """The Trainer puts the --report-to integrations right after its DefaultFlowCallback, before the callbacks it is
    given; a recorder in that place must see what zero-kit's callbacks add once they are moved to the front."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from zero_kit.model import load_model
    from zero_kit.train.callbacks import ThroughputCallback, before_trackers

    class Tracker(TrainerCallback):
        seen: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.seen.append(dict(logs))

    throughput, perplexity = ThroughputCallback(), PerplexityCallback()
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, include_num_input_tokens_seen=True)
    trainer = Trainer(model=load_model(None), args=args, callbacks=[throughput, perplexity])
    trainer.callback_handler.callbacks.insert(1, Tracker())  # where get_reporting_integration_callbacks puts them
    before_trackers(trainer, throughput, perplexity)
    handler, state = trainer.callback_handler, trainer.state
    handler.on_train_begin(args, state, trainer.control)
    state.num_input_tokens_seen += 1000
    handler.on_log(args, state, trainer.control, logs={"loss": 2.5})
    handler.on_log(args, state, trainer.control, logs={"eval_loss": 2.0})
    assert Tracker.seen[0]["tokens_per_s"] > 0 and Tracker.seen[1]["eval_perplexity"] == pytest.approx(math.exp(2))

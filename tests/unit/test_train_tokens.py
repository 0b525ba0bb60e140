"""The tokens `zero-kit train` counts (zero_kit.train.callbacks) without the Trainer's gather after every micro batch:
the same non-padding count, the sum over the ranks carried by the preemption check's one all-reduce per step, and
log entries with the keys the Trainer's own count gave them (trackers and trainer_state.json see no difference)."""

from __future__ import annotations

import time

import torch
from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

from zero_kit.dist import any_rank_and_sum
from zero_kit.model import load_model
from zero_kit.train.callbacks import PreemptionCallback, TokenCount, counting_trainer

PAD = 2


def _batch(mask: bool = True) -> dict:
    ids = torch.tensor([[5, 6, 7, PAD], [8, 9, PAD, PAD]])
    batch = {"input_ids": ids, "labels": ids.clone()}
    if mask:
        batch["attention_mask"] = (ids != PAD).long()
    return batch


def test_the_count_is_the_trainers_non_padding_count():
    tokens = TokenCount(PAD)
    tokens.add(_batch())  # the attention mask's ones
    tokens.add(_batch(mask=False))  # packed rows have no mask: the ids that are not padding
    assert int(tokens.take()) == 10 and tokens.take() == 0


def test_one_all_reduce_carries_the_stop_flag_and_the_tokens():
    assert any_rank_and_sum(False, torch.tensor(7)) == (False, 7)  # without a group: this rank's own
    assert any_rank_and_sum(True) == (True, 0)


def test_the_preemption_check_adds_the_steps_tokens_to_the_state():
    tokens = TokenCount(PAD)
    preemption = PreemptionCallback(tokens=tokens)
    try:
        state, control = TrainerState(), TrainerControl()
        state.num_input_tokens_seen = 100  # a resumed run's count
        tokens.on_train_begin(None, state, control)
        tokens.add(_batch())
        preemption.on_step_end(None, state, control)
        assert state.num_input_tokens_seen == 105 and not control.should_training_stop
        preemption.on_step_end(None, state, control)  # nothing trained since: nothing added
        assert state.num_input_tokens_seen == 105 and tokens.at_start == 100
    finally:
        preemption.on_train_end(None, state, control)  # the signal handlers back


def test_log_entries_keep_the_keys_of_the_trainers_own_count(tmp_path):
    """The Trainer with include_num_input_tokens_seen adds the count, and with a start time the session's speed, to
    every log entry; zero-kit's Trainer, which counts itself, adds the same."""
    model, tokens = load_model(None), TokenCount(PAD)
    ours = counting_trainer(tokens)(model=model, args=TrainingArguments(str(tmp_path / "a"), report_to=[],
                                                                        use_cpu=True))  # fmt: skip
    theirs = Trainer(model=model, args=TrainingArguments(str(tmp_path / "b"), report_to=[], use_cpu=True,
                                                          include_num_input_tokens_seen="non_padding"))  # fmt: skip
    theirs._initial_num_input_tokens_seen = 0  # what its train() sets before the first log
    for trainer in (ours, theirs):
        trainer.state.num_input_tokens_seen = 5000
        trainer.log({"loss": 1.0}, time.time() - 2)
    entry, reference = ours.state.log_history[-1], theirs.state.log_history[-1]
    assert set(entry) == set(reference) and entry["num_input_tokens_seen"] == 5000
    assert entry["train_tokens_per_second"] > 0


def test_each_trained_micro_batch_is_counted(tmp_path):
    tokens = TokenCount(PAD)
    model = load_model(None)
    trainer = counting_trainer(tokens)(model=model, args=TrainingArguments(str(tmp_path), report_to=[], use_cpu=True))
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets
    trainer.training_step(model, _batch())
    assert int(tokens.take()) == 5

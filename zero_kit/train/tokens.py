"""The tokens a `zero-kit train` run trained (tokens/s, MFU, `tokens_seen` in train_log.jsonl), counted without a
collective of their own. The HF Trainer's count (`include_num_input_tokens_seen`) gathers one number across the
ranks after every micro batch and waits for it (`.item()`; on a GPU a device sync), a round trip that neither the
plain Trainer (off by default) nor the step needs (benchmarks/train_overhead). Here each rank adds up the
non-padding tokens of the micro batches it trains where they are (`CountingTrainer.training_step`), and the sum over
the ranks travels in the all-reduce the preemption check makes at every step anyway
(`zero_kit.train.callbacks.PreemptionCallback`, `zero_kit.dist.any_rank_and_sum`). The Trainer's state, its log
entries and the checkpoints' trainer_state.json get what the Trainer's own count gave them."""

from __future__ import annotations

from transformers import TrainerCallback


class TokenCount(TrainerCallback):
    """This rank's non-padding tokens since the last `take`, as the Trainer counts them with
    `include_num_input_tokens_seen="non_padding"`: the attention mask's ones, or (packed rows, which have none) the
    input ids that are not padding."""

    def __init__(self, pad_id: int | None):
        self.pad_id = pad_id
        self.pending = 0
        self.at_start = 0
        """The run's count when this training began (a resumed run's, from its checkpoint): the session's tokens/s."""

    def add(self, inputs) -> None:
        mask = inputs.get("attention_mask")
        ids = inputs["input_ids"]
        if mask is not None:
            count = mask.sum()
        elif self.pad_id is not None:
            count = (ids != self.pad_id).sum()
        else:
            count = ids.numel()
        self.pending = self.pending + count  # a tensor stays where it is: no wait here

    def take(self):
        pending, self.pending = self.pending, 0
        return pending

    def on_train_begin(self, args, state, control, **kwargs):
        self.at_start = state.num_input_tokens_seen


def counting_trainer(tokens: TokenCount) -> type:
    """The Trainer class of a run: each trained micro batch goes to `tokens`; each log entry gets the count and, with
    the training's start time, the session's speed, as the Trainer adds them when it counts itself."""
    from transformers import Trainer
    from transformers.trainer_utils import speed_metrics

    class CountingTrainer(Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            tokens.add(inputs)
            return super().training_step(model, inputs, *args, **kwargs)

        def log(self, logs, start_time=None, *args, **kwargs):
            seen = self.state.num_input_tokens_seen
            logs["num_input_tokens_seen"] = seen
            if start_time is not None:
                logs.update(speed_metrics("train", start_time, num_tokens=seen - tokens.at_start))
            return super().log(logs, start_time, *args, **kwargs)

    return CountingTrainer

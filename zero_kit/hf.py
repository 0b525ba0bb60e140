"""Python API for people with their own Hugging Face `Trainer` script.

from transformers import Trainer, TrainingArguments
from zero_kit.hf import ThroughputCallback, deepspeed_config

ds = deepspeed_config(stage=3, offload_optimizer="cpu")          # same options as `zero-kit train`
args = TrainingArguments("out", deepspeed=ds, per_device_train_batch_size=4,
                         include_num_input_tokens_seen=True, bf16=True)   # before building the model (ZeRO-3 init)
model = AutoModelForCausalLM.from_pretrained("my-llama")
trainer = Trainer(model=model, args=args, train_dataset=ds_train,
                  callbacks=[ThroughputCallback(model)])          # logs tokens_per_s (and mfu on GPU)
trainer.train()
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback

from zero_kit.train.options import TrainOptions, check_options
from zero_kit.train.trainer_config import trainer_ds_config


def deepspeed_config(**options: Any) -> dict:
    """The DeepSpeed dict for `TrainingArguments(deepspeed=...)`, from the same options as `zero-kit train`
    (e.g. `stage=3, offload_optimizer="cpu"`, or `ds_config="my.json"` to lint and load a file)."""
    opts = TrainOptions(**options)
    check_options(opts)
    return trainer_ds_config(opts)


class ThroughputCallback(TrainerCallback):
    """Adds `tokens_per_s` (all ranks together, since the previous log) and, on a known GPU, `mfu` to each
    log entry. Needs `TrainingArguments(include_num_input_tokens_seen=True)` (tokens are counted by the Trainer).
    MFU = tokens/s per device x FLOPs per token / device dense peak (zero_kit.metrics)."""

    def __init__(self, model=None, seq_len: int | None = None):
        self._flops_per_token = _flops_per_token(model, seq_len) if model is not None else None
        self._last_time: float | None = None
        self._last_tokens = 0
        self.last: dict[str, float] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self._last_time = time.perf_counter()
        self._last_tokens = state.num_input_tokens_seen

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self._last_time is None:
            return
        now = time.perf_counter()
        tokens = state.num_input_tokens_seen - self._last_tokens
        if tokens > 0 and now > self._last_time:
            logs["tokens_per_s"] = round(tokens / (now - self._last_time), 1)
            value = self._mfu(args, logs["tokens_per_s"])
            if value is not None:
                logs["mfu"] = round(value, 4)
        self._last_time, self._last_tokens = now, state.num_input_tokens_seen
        self.last = dict(logs)

    def _mfu(self, args, tokens_per_s: float) -> float | None:
        import torch

        if self._flops_per_token is None or not torch.cuda.is_available():
            return None
        from zero_kit import metrics

        precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        peak = metrics.peak_flops(torch.cuda.get_device_name(), precision)
        return metrics.mfu(tokens_per_s / max(args.world_size, 1), self._flops_per_token, peak)


def _flops_per_token(model, seq_len: int | None) -> float | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    from zero_kit import metrics

    # ds_numel: under ZeRO-3 a rank's parameter tensors are empty; DeepSpeed records the full size.
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    seq = seq_len or getattr(config, "max_position_embeddings", 0)
    return metrics.flops_per_token(n_params, config.num_hidden_layers, config.hidden_size, seq)

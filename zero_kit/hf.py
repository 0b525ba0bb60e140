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

from typing import Any

from zero_kit.train.callbacks import ThroughputCallback
from zero_kit.train.options import TrainOptions, check_options
from zero_kit.train.trainer_config import trainer_ds_config


def deepspeed_config(**options: Any) -> dict:
    """The DeepSpeed dict for `TrainingArguments(deepspeed=...)`, from the same options as `zero-kit train`
    (e.g. `stage=3, offload_optimizer="cpu"`, or `ds_config="my.json"` to lint and load a file): the same step
    `zero_kit.train.run.resolve_run` makes the run's dict with. It does not depend on the machine that calls it
    (a script may write the config on a login node for GPU nodes); your TrainingArguments decide the rest."""
    opts = TrainOptions(**options)
    check_options(opts)
    return trainer_ds_config(opts)


__all__ = ["ThroughputCallback", "deepspeed_config"]

"""Preference tuning in `zero-kit train --method dpo` (issue 49): TRL's DPOTrainer in place of the HF Trainer, with
the same run around it (plan, ZeRO stage, callbacks, checkpoints, resume, export). zero_kit writes no loss: TRL's
DPOTrainer computes it, its variants (--dpo-loss) and its figures (rewards, margins, accuracies).

The reference model:
- with --lora-r, none: TRL wraps the model with the adapter (peft_config) and takes the reference log-probabilities
  from the same model with the adapter switched off, the base as it was loaded;
- full fine-tuning: a second copy of the starting model, built like the trained one (the same directory, or the
  embedded model from the same seed; under ZeRO-3 inside zero.Init, so no rank ever holds all of it) and handed to
  TRL, which prepares it with DeepSpeed at the run's ZeRO-3 (its parameters partitioned like the trained model's;
  ZeRO-1/2 shard only optimizer states and gradients, which a frozen model has none of, so there TRL keeps a whole
  copy per rank, stage 0) and without an optimizer: it is only ever run forward, under no_grad, and never trained.

The pairs were tokenized once by the starting process as TRL tokenizes them (zero_kit.data.preference): TRL's own
preparation is skipped for them. TRL is an optional dependency (`pip install 'zero_kit[dpo]'`): a run without it, or
with a release outside the tested range, is refused before any work (zero_kit.train.guards.inputs).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from zero_kit.errors import UserError
from zero_kit.log import say
from zero_kit.train.options import TrainOptions

INSTALL = "pip install 'zero_kit[dpo]'"
TRL_TESTED = (">=0.29.1", "<2")
"""The TRL releases CI tests (constraints/oldest.txt, constraints/newest.txt); setup.py's extra says the same."""
DEFAULT_BETA = 0.1
DEFAULT_LOSS = "sigmoid"


def trl_version() -> str | None:
    """The installed TRL's version, None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return None


def check_trl(opts: TrainOptions) -> None:
    """--method dpo needs TRL, in the tested range, knowing --dpo-loss: said before any work, with the fix."""
    if opts.method != "dpo":
        return
    from packaging.specifiers import SpecifierSet

    found = trl_version()
    if found is None:
        raise UserError(f"--method dpo needs TRL, which is not installed (in {sys.executable})", INSTALL)
    tested = SpecifierSet(",".join(TRL_TESTED))
    if found not in tested:
        raise UserError(f"--method dpo: TRL {found} is installed, zero-kit is tested with TRL {tested}", INSTALL)
    loss = opts.dpo_loss or DEFAULT_LOSS
    known = trl_losses()
    if known and loss not in known:
        raise UserError(f"--dpo-loss {loss}: TRL {found} does not know it (it knows {', '.join(known)})",
                        f"pick one of those, or upgrade TRL ({INSTALL} -U)")  # fmt: skip


def trl_losses() -> list[str]:
    """The loss types the installed TRL lists for DPOConfig.loss_type (its own help text names them)."""
    from trl.trainer.dpo_config import DPOConfig

    help_text = DPOConfig.__dataclass_fields__["loss_type"].metadata.get("help", "")
    return re.findall(r"'(\w+)'", help_text.split("If multiple")[0])


def arguments_class(opts: TrainOptions) -> type:
    """The Trainer's arguments class of the run: TRL's DPOConfig (a TrainingArguments) for --method dpo."""
    if opts.method == "dpo":
        from trl import DPOConfig

        return DPOConfig
    from transformers import TrainingArguments

    return TrainingArguments


def method_arguments(opts: TrainOptions) -> dict[str, Any]:
    """DPOConfig's own arguments of the run (none for sft). max_length: every pair fits it (zero_kit.data.preference
    refused or skipped the others), so TRL's collator never cuts one."""
    if opts.method != "dpo":
        return {}
    return {
        "beta": DEFAULT_BETA if opts.beta is None else opts.beta,
        "loss_type": [opts.dpo_loss or DEFAULT_LOSS],
        "max_length": opts.max_length,
        "precompute_ref_log_probs": False,
    }


def trainer_class(counting) -> type:
    """TRL's DPOTrainer for zero-kit's ranks; `counting`: zero_kit.train.callbacks.counting_trainer's class maker."""
    from trl import DPOTrainer

    from zero_kit.data.preference import ID_COLUMNS

    class PreparedPairsDPOTrainer(DPOTrainer):
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            if all(name in dataset.column_names for name in ID_COLUMNS):
                return dataset  # tokenized once, as TRL tokenizes, by the starting process (zero_kit.data.preference)
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)

        def create_model_card(self, *args, **kwargs):
            """No README.md in --output: zero-kit writes there only its own files (guards.output)."""

        def _send_telemetry(self):
            """zero-kit runs offline: nothing is sent (TRL >= 1.x reports its trainers' use to the Hub)."""

    return counting(PreparedPairsDPOTrainer)


def build_reference(opts: TrainOptions):
    """The reference of full fine-tuning: the starting model again, built as the trained one is (zero_kit.model;
    under ZeRO-3 inside zero.Init, which the run's TrainingArguments registered). None with LoRA: the base model,
    adapter off, is the reference."""
    if opts.lora_r is not None:
        return None
    import torch

    from zero_kit import model as zk_model

    return zk_model.load_model(
        opts.model, dtype=torch.float32, seed=opts.seed, trust_remote_code=opts.trust_remote_code
    )


def dpo_trainer(cls: type, opts: TrainOptions, model, args, tokenizer, data, callbacks: list, *, zero3: bool):
    """The run's DPOTrainer: the model (wrapped by TRL with the adapter under --lora-r), the reference (prepared by
    TRL with DeepSpeed, no optimizer) and the prepared pairs."""
    from zero_kit.train.lora import lora_config

    trainer = cls(
        model=model,
        ref_model=build_reference(opts),
        args=args,
        train_dataset=data.dataset,
        eval_dataset=data.eval_dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=lora_config(opts, model.config.model_type) if opts.lora_r is not None else None,
    )
    if opts.lora_r is not None and zero3:  # as zero_kit.train.lora.apply_lora does, for the same reason
        trainer.model.enable_input_require_grads()
    return trainer


def say_reference(trainer, count_held, speak: bool) -> None:
    """One line about the reference model; `count_held(module)` gathers the elements each rank holds (a collective:
    every rank calls this)."""
    if trainer.ref_model is None:
        if speak:
            say("zero-kit train: DPO reference: the base model with the LoRA adapter off (no second model)")
        return
    module = getattr(trainer.ref_model, "module", trainer.ref_model)  # TRL's DeepSpeed engine around the model
    held = count_held(module)
    if speak:
        per_rank = ", ".join(f"{n:,}" for n in held["elements_held_per_rank"])
        say(f"zero-kit train: DPO reference: a frozen copy of the starting model, {held['total_parameters']:,} "
            f"parameters, held per rank: [{per_rank}] (DeepSpeed, no optimizer)")  # fmt: skip

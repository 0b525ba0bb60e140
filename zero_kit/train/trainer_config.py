"""The DeepSpeed config of a `zero-kit train` run: generated from `--stage` and friends ("auto" values, filled by
the HF Trainer from the same flags), or a user's `--ds-config` read strictly and linted for the HF Trainer."""

from __future__ import annotations

import dataclasses

from zero_kit.errors import UserError
from zero_kit.train.options import TrainOptions, zero_spec


def adopt_file_values(opts: TrainOptions, config: dict) -> TrainOptions:
    """With --ds-config, concrete numbers in the file win over flags left at their defaults: the HF Trainer
    refuses a config whose batch or optimizer values differ from its own arguments."""
    defaults = TrainOptions()
    params = config.get("optimizer", {}).get("params", {}) if isinstance(config.get("optimizer"), dict) else {}
    sources = {
        "micro_batch": config.get("train_micro_batch_size_per_gpu"),
        "grad_accum": config.get("gradient_accumulation_steps"),
        "lr": params.get("lr"),
        "weight_decay": params.get("weight_decay"),
        "gradient_clipping": config.get("gradient_clipping"),
    }
    concrete = {k: v for k, v in sources.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    given = {k: v for k, v in concrete.items() if getattr(opts, k) != getattr(defaults, k)}
    conflicts = [
        f"--{k.replace('_', '-')} {getattr(opts, k)} vs {v} in the file"
        for k, v in given.items()
        if getattr(opts, k) != v
    ]
    if conflicts:
        raise UserError(
            f"--ds-config {opts.ds_config} sets values that differ from the flags: {'; '.join(conflicts)}",
            'drop those flags, or write "auto" in the file so the flags decide',
        )
    return dataclasses.replace(opts, **{k: v for k, v in concrete.items() if k not in given})


def trainer_ds_config(opts: TrainOptions) -> dict:
    """Generated from `--stage` and friends ("auto" values, filled by the Trainer), or the linted `--ds-config`.
    `opts` has passed `check_options` (once, by the caller)."""
    if opts.ds_config is None:
        from zero_kit.config.builder import build_ds_config

        return build_ds_config(zero_spec(opts))
    from zero_kit.lint import LintContext, load_checked

    return load_checked(opts.ds_config, LintContext(target="hf-trainer"), "--ds-config")

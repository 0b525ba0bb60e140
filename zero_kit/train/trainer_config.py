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


def trainer_ds_config(opts: TrainOptions, *, torch_adam: bool = False, device: str | None = None) -> dict:
    """Generated from `--stage` and friends ("auto" values, filled by the Trainer), or the linted `--ds-config`.
    `opts` has passed `check_options` (once, by the caller). `torch_adam`: the run is on CPU, where an Adam
    section without optimizer offload should use torch's AdamW (see `RunAdjustments.torch_adam`). `device`: the
    run's device ("cuda" or "cpu"; None: unknown), so a file with CUDA-only features (ZeRO++ qwZ/qgZ) is refused
    on a CPU run before any work."""
    from zero_kit.config.builder import RunAdjustments, build_ds_config, with_torch_adam

    if opts.ds_config is None:
        wants = torch_adam and opts.offload_optimizer == "none"
        return build_ds_config(zero_spec(opts), RunAdjustments(torch_adam=wants))
    from zero_kit.lint import LintContext, load_checked

    config = load_checked(opts.ds_config, LintContext(target="hf-trainer", device=device), "--ds-config")
    offload = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    if torch_adam and offload in (None, "none") and "optimizer" in config:
        config["optimizer"] = with_torch_adam(config["optimizer"])
    return config

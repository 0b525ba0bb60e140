"""The DeepSpeed config of a `zero-kit train` run: generated from `--stage` and friends ("auto" values, filled by
the HF Trainer from the same flags), or a user's `--ds-config` read strictly and linted for the HF Trainer. The one
step that makes the dict: `zero_kit.train.run.resolve_run` and `zero_kit.hf.deepspeed_config` both call it."""

from __future__ import annotations

from zero_kit.train.options import TrainOptions, zero_spec


def trainer_ds_config(
    opts: TrainOptions,
    *,
    torch_adam: bool = False,
    device: str | None = None,
    hidden_size: int | None = None,
    trainable: int | None = None,
) -> dict:
    """Generated from `--stage` and friends ("auto" values, filled by the Trainer), or the linted `--ds-config`.
    `opts` has passed `check_options` (once, by the caller). `torch_adam`: the run is on CPU, where an Adam
    section without optimizer offload should use torch's AdamW (see `RunAdjustments.torch_adam`). `device`: the
    run's device ("cuda" or "cpu"; None: unknown), so a file with CUDA-only features (ZeRO++ qwZ/qgZ) is refused
    on a CPU run before any work, and the generator decides overlap_comm for it. `hidden_size` (the model's): the
    measured buckets (zero_kit.config.builder.measured_buckets) as numbers instead of "auto", which the Trainer
    fills with h², no reduce bucket larger than the `trainable` parameters."""
    from zero_kit.config.builder import RunAdjustments, build_ds_config, measured_buckets, on_cpu_ranks

    if opts.ds_config is None:
        spec = zero_spec(opts, device)
        buckets = measured_buckets(spec.stage, hidden_size, trainable, spec.device) if hidden_size else {}
        return build_ds_config(spec, RunAdjustments(torch_adam=torch_adam, zero_overrides=buckets))
    from zero_kit.lint import LintContext, load_checked

    config = load_checked(opts.ds_config, LintContext(target="hf-trainer", device=device), "--ds-config")
    return on_cpu_ranks(config) if torch_adam else config

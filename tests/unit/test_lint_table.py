"""A table of bad DeepSpeed configs: each must produce a problem at the right key path with a useful message."""

from __future__ import annotations

import copy

import pytest

from zero_kit.lint import LintContext, Problem, lint
from zero_kit.lint.discover import deepspeed_parse, discover

BASE = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2},
}
HF_BASE = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2},
}


def merged(base: dict, patch: dict) -> dict:
    """`base` updated by `patch` (nested dicts merged; a value of ... deletes the key)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is ...:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def z(**zero) -> dict:
    return {"zero_optimization": zero}


# fmt: off
# (id, patch onto BASE, target, world size, expected key path, message fragment, severity)
CASES = [
    ("misspelt-top-level", {"gradient_acumulation_steps": 2}, "deepspeed", 4, "gradient_acumulation_steps", "gradient_accumulation_steps", "error"),
    ("misspelt-zero-section", {"zero_optimisation": {"stage": 3}}, "deepspeed", 4, "zero_optimisation", "zero_optimization", "error"),
    ("misspelt-steps-per-print", {"steps_per_prnt": 10}, "deepspeed", 4, "steps_per_prnt", "steps_per_print", "error"),
    ("unknown-zero-key", z(overlap_com=True), "deepspeed", 4, "zero_optimization.overlap_com", "overlap_comm", "error"),
    ("unknown-offload-key", z(stage=3, offload_param={"device": "cpu", "pin_memori": True}), "deepspeed", 4, "zero_optimization.offload_param.pin_memori", "pin_memory", "error"),
    ("unknown-fp16-key", {"bf16": ..., "fp16": {"enabled": True, "loss_scal": 0}}, "deepspeed", 4, "fp16.loss_scal", "loss_scale", "error"),
    ("unknown-bf16-key", {"bf16": {"enabled": True, "enable": True}}, "deepspeed", 4, "bf16.enable", "enabled", "error"),
    ("unknown-activation-ckpt-key", {"activation_checkpointing": {"partition_activation": True}}, "deepspeed", 4, "activation_checkpointing.partition_activation", "partition_activations", "error"),
    ("unknown-flops-profiler-key", {"flops_profiler": {"enabled": True, "profile_stp": 1}}, "deepspeed", 4, "flops_profiler.profile_stp", "profile_step", "error"),
    ("unknown-aio-key", {"aio": {"queue_dept": 8}}, "deepspeed", 4, "aio.queue_dept", "queue_depth", "error"),
    ("unknown-checkpoint-key", {"checkpoint": {"tag_validaton": "Warn"}}, "deepspeed", 4, "checkpoint.tag_validaton", "tag_validation", "error"),
    ("unknown-tensorboard-key", {"tensorboard": {"enabled": True, "output_pth": "/tmp"}}, "deepspeed", 4, "tensorboard.output_pth", "output_path", "error"),
    ("unknown-optimizer-param", {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decy": 0.1}}}, "deepspeed", 4, "optimizer.params.weight_decy", "weight_decay", "error"),
    ("unknown-scheduler-param", {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}}}, "deepspeed", 4, "scheduler.params.warmup_num_step", "warmup_num_steps", "error"),
    ("axolotl-compile-keys-rejected", {"compile": {"disable": False, "backend": "inductor"}}, "deepspeed", 4, "compile.backend", "rejects", "error"),
    ("micro-as-string", {"train_micro_batch_size_per_gpu": "2"}, "deepspeed", 4, "train_micro_batch_size_per_gpu", "without quotes", "error"),
    ("bucket-as-string", z(stage=2, reduce_bucket_size="5e8"), "deepspeed", 4, "zero_optimization.reduce_bucket_size", "without quotes", "error"),
    ("stage-as-string", z(stage="3"), "deepspeed", 4, "zero_optimization.stage", "without quotes", "error"),
    ("bool-as-string", {"bf16": {"enabled": "true"}}, "deepspeed", 4, "bf16.enabled", "true without quotes", "error"),
    ("clipping-as-string", {"gradient_clipping": "1.0"}, "deepspeed", 4, "gradient_clipping", "without quotes", "error"),
    ("lr-as-string", {"optimizer": {"type": "AdamW", "params": {"lr": "3e-4"}}}, "deepspeed", 4, "optimizer.params.lr", "without quotes", "error"),
    ("ckpt-bool-as-string", {"activation_checkpointing": {"partition_activations": "yes"}}, "deepspeed", 4, "activation_checkpointing.partition_activations", "expected true/false", "error"),
    ("number-for-bool", z(stage=2, overlap_comm=1), "deepspeed", 4, "zero_optimization.overlap_comm", "expected true/false", "error"),
    ("section-not-object", {"zero_optimization": [2]}, "deepspeed", 4, "zero_optimization", "expected an object", "error"),
    ("bad-stage-value", z(stage=4), "deepspeed", 4, "zero_optimization.stage", "use one of", "error"),
    ("offload-device-typo", z(stage=3, offload_param={"device": "gpu"}), "deepspeed", 4, "zero_optimization.offload_param.device", "use one of 'none', 'cpu' or 'nvme'", "error"),
    ("auto-for-plain-deepspeed", {"train_batch_size": "auto"}, "deepspeed", 4, "train_batch_size", "HF Trainer", "error"),
    ("auto-nested-plain-deepspeed", z(stage=2, reduce_bucket_size="auto"), "deepspeed", 4, "zero_optimization.reduce_bucket_size", "deepspeed.initialize", "error"),
    ("batch-triple-world-size", {}, "deepspeed", 8, "train_batch_size", "set train_batch_size to 32 or leave it out", "error"),
    ("batch-triple-world-size-2", {"train_batch_size": 8}, "deepspeed", 4, "train_batch_size", "train_batch_size(8) != micro(2) * grad_accum(2) * world_size(4", "error"),
    ("batch-not-divisible", {"gradient_accumulation_steps": ..., "train_batch_size": 10}, "deepspeed", 4, "train_batch_size", "not divisible", "error"),
    ("batch-impossible-no-world", {"train_batch_size": 10}, "deepspeed", None, "train_batch_size", "train_batch_size(10) != micro(2) * grad_accum(2)", "error"),
    ("sequence-parallel-world", {"sequence_parallel_size": 2}, "deepspeed", 4, "train_batch_size", "world_size(2, --world-size / sequence_parallel_size 2)", "error"),
    ("sequence-parallel-indivisible", {"sequence_parallel_size": 3}, "deepspeed", 4, "sequence_parallel_size", "not divisible", "error"),
    ("micro-zero", {"train_micro_batch_size_per_gpu": 0}, "deepspeed", 4, "train_micro_batch_size_per_gpu", "> 0", "error"),
    ("grad-accum-negative", {"gradient_accumulation_steps": -1}, "deepspeed", 4, "gradient_accumulation_steps", "> 0", "error"),
    ("train-batch-float", {"train_batch_size": 16.5}, "deepspeed", 4, "train_batch_size", "whole number", "error"),
    ("no-batch-at-all", {"train_batch_size": ..., "train_micro_batch_size_per_gpu": ...}, "deepspeed", 4, "train_batch_size", "neither", "error"),
    ("fp16-and-bf16", {"fp16": {"enabled": True}}, "deepspeed", 4, "bf16.enabled", "both enabled", "error"),
    ("offload-param-stage2", z(stage=2, offload_param={"device": "cpu"}), "deepspeed", 4, "zero_optimization.offload_param.device", "stage 3", "error"),
    ("offload-optimizer-stage0", z(stage=0, offload_optimizer={"device": "cpu"}), "deepspeed", 4, "zero_optimization.offload_optimizer.device", "stage 1 or higher", "error"),
    ("nvme-without-path", z(stage=3, offload_param={"device": "nvme"}), "deepspeed", 4, "zero_optimization.offload_param.nvme_path", "nvme_path", "error"),
    ("nvme-optimizer-stage2", z(stage=2, offload_optimizer={"device": "nvme", "nvme_path": "/nvme"}), "deepspeed", 4, "zero_optimization.offload_optimizer.device", "NVMe optimizer offload needs ZeRO stage 3", "error"),
    ("hf-stage3-no-gather", {**HF_BASE, **z(stage=3)}, "hf-trainer", 4, "zero_optimization.stage3_gather_16bit_weights_on_model_save", "empty", "warning"),
    ("hf-auto-not-filled", {**HF_BASE, **z(stage=2, allgather_bucket_size="auto")}, "hf-trainer", 4, "zero_optimization.allgather_bucket_size", "drops it and uses its default", "warning"),
    ("hf-auto-optimizer-param", {**HF_BASE, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "amsgrad": "auto"}}}, "hf-trainer", 4, "optimizer.params.amsgrad", "does not fill", "error"),
    ("other-tool-key-warns", {"sequence_parallel": {"enabled": True}}, "deepspeed", 4, "sequence_parallel", "ignores it", "warning"),
    ("case-typo-is-error", {"Steps_Per_Print": 10}, "deepspeed", 4, "Steps_Per_Print", "steps_per_print", "error"),
    ("hf-auto-offload-device", {**HF_BASE, **z(stage=3, offload_param={"device": "auto"})}, "hf-trainer", 4, "zero_optimization.offload_param.device", "does not fill", "error"),
    ("accelerate-auto-batch-cpu-only", HF_BASE, "accelerate", 2, "train_batch_size", "CPU-only host", "warning"),
    ("hf-hard-coded-batch", {**HF_BASE, "train_batch_size": 32}, "hf-trainer", 2, "train_batch_size", "per_device_train_batch_size x gradient_accumulation_steps", "warning"),
    ("top-level-offload", {"offload_optimizer": {"device": "cpu"}}, "deepspeed", 4, "offload_optimizer", "move it under zero_optimization", "error"),
    ("top-level-stage3-key", {"stage3_prefetch_bucket_size": 1000}, "deepspeed", 4, "stage3_prefetch_bucket_size", "belongs to zero_optimization", "error"),
    ("steps-per-print-string", {"steps_per_print": "10"}, "deepspeed", 4, "steps_per_print", "expected a number, found a string", "error"),
    ("one-bit-optimizer", {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4}}}, "deepspeed", 4, "optimizer.type", "older releases", "error"),
    ("offload-needs-ds-optimizer", z(stage=2, offload_optimizer={"device": "cpu"}), "deepspeed", 4, "zero_optimization.offload_optimizer.device", "DeepSpeedCPUAdam", "warning"),
    ("accelerate-unknown-world-size", {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}, "accelerate", None, "train_batch_size", "--world-size", "warning"),
    ("accelerate-needs-zero", {"zero_optimization": ...}, "accelerate", 4, "zero_optimization", "accelerate refuses", "error"),
    ("removed-feature", {"sparse_attention": {"mode": "fixed"}}, "deepspeed", 4, "sparse_attention", "valid only on older DeepSpeed releases", "error"),
    ("removed-zero-key", z(stage=3, mics_shard_size=8), "deepspeed", 4, "zero_optimization.mics_shard_size", "MiCS", "error"),
    ("deprecated-cpu-offload", z(stage=2, cpu_offload=True), "deepspeed", 4, "zero_optimization.cpu_offload", "deprecated", "warning"),
    ("stage3-key-at-stage2", z(stage=2, stage3_max_live_parameters=1000), "deepspeed", 4, "zero_optimization.stage3_max_live_parameters", "no effect", "warning"),
    ("max-grad-norm-optimizer", {"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}}, "deepspeed", 4, "optimizer.params.max_grad_norm", "when the script passes none", "warning"),
    ("max-grad-norm-hf-trainer", {"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}}, "hf-trainer", 4, "optimizer.params.max_grad_norm", "gradient_clipping", "error"),
    ("unknown-optimizer-type", {"optimizer": {"type": "AdamWW", "params": {}}}, "deepspeed", 4, "optimizer.type", "AdamW", "error"),
    ("unknown-scheduler-type", {"scheduler": {"type": "WarmupDecay", "params": {}}}, "deepspeed", 4, "scheduler.type", "WarmupDecayLR", "error"),
    ("optimizer-without-type", {"optimizer": {"params": {"lr": 1e-4}}}, "deepspeed", 4, "optimizer.type", "ignores the whole section", "warning"),
    ("warmup-zero", {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}, "deepspeed", 4, "scheduler.params.warmup_num_steps", "warmup_num_steps", "error"),
    ("total-below-warmup", {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 100, "total_num_steps": 10}}}, "deepspeed", 4, "scheduler.params.total_num_steps", "never starts", "error"),
    ("nan-value", {"gradient_clipping": float("nan")}, "deepspeed", 4, "gradient_clipping", "NaN", "error"),
    ("bad-allreduce-op", {"gradient_allreduce_op": "max"}, "deepspeed", 4, "gradient_allreduce_op", "DeepSpeed's own parser", "error"),
    ("hybrid-engine-bound", {"hybrid_engine": {"max_out_tokens": 0}}, "deepspeed", 4, "hybrid_engine.max_out_tokens", "greater than 0", "error"),
    ("fractional-bucket", z(stage=2, reduce_bucket_size=1.5), "deepspeed", 4, "zero_optimization.reduce_bucket_size", "whole number", "error"),
    ("bad-grad-accum-dtype", {"data_types": {"grad_accum_dtype": "fp23"}}, "deepspeed", 4, "data_types.grad_accum_dtype", "fp32", "error"),
    ("bad-comm-dtype", {"communication_data_type": "int4"}, "deepspeed", 4, "communication_data_type", "communication_data_type", "error"),
]
# fmt: on


def _release_facts() -> dict[str, bool]:
    """Which version-dependent cases the installed DeepSpeed makes true, asked of DeepSpeed itself (CI runs the
    newest and the oldest supported release): removed blocks and keys, a key added in 0.19, a bound DeepSpeed's
    own parser checks."""
    import deepspeed.runtime.config as ds_config

    removed_top = getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    removed_zero = getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})
    return {
        "removed-feature": "sparse_attention" in removed_top,
        "removed-zero-key": "mics_shard_size" in removed_zero,
        "bad-allreduce-op": "gradient_allreduce_op" in discover().keys[""],
        "one-bit-optimizer": "onebitadam" not in ds_config.DEEPSPEED_OPTIMIZERS,
        "hybrid-engine-bound": deepspeed_parse({"train_batch_size": 16, "hybrid_engine": {"max_out_tokens": 0}}, 4)
        is not None,
    }


# What each version-dependent case gives on a release where its fact does not hold: a still-valid block or key
# is no error; a key the release does not know yet is the unknown-key warning.
ON_OLDER_RELEASES = {
    "removed-feature": None,
    "removed-zero-key": None,
    "bad-allreduce-op": ("unknown key", "warning"),
    "hybrid-engine-bound": None,
    "one-bit-optimizer": None,
}


def _problems(patch: dict, target: str, world_size: int | None) -> list[Problem]:
    base = HF_BASE if target != "deepspeed" and patch is not HF_BASE else BASE
    config = merged(base, patch) if patch is not HF_BASE else copy.deepcopy(HF_BASE)
    return lint(config, LintContext(world_size=world_size, target=target))


def test_table_is_big_enough():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("name", "patch", "target", "world", "path", "fragment", "severity"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_config_is_reported(name, patch, target, world, path, fragment, severity):
    problems = _problems(patch, target, world)
    at_path = [p for p in problems if p.path == path]
    if name in ON_OLDER_RELEASES and not _release_facts()[name]:
        if ON_OLDER_RELEASES[name] is None:
            assert not [p for p in at_path if p.severity == "error"], [str(p) for p in at_path]
            return
        fragment, severity = ON_OLDER_RELEASES[name]
    assert at_path, f"no problem at {path}; got {[str(p) for p in problems]}"
    assert any(p.severity == severity for p in at_path), [str(p) for p in at_path]
    text = " ".join(f"{p.message} {p.fix}" for p in at_path)
    assert fragment in text, text
    assert all(p.fix for p in at_path), "every problem says what to do"


def test_good_base_is_clean():
    assert lint(BASE, LintContext(world_size=4)) == []
    assert lint(HF_BASE, LintContext(world_size=4, target="hf-trainer")) == []


def test_all_problems_in_one_run():
    config = merged(
        BASE, {"steps_per_prnt": 1, "fp16": {"enabled": True}, **z(stage=2, offload_param={"device": "cpu"})}
    )
    paths = {p.path for p in lint(config, LintContext(world_size=8))}
    assert {"steps_per_prnt", "bf16.enabled", "zero_optimization.offload_param.device", "train_batch_size"} <= paths


def test_not_an_object():
    (problem,) = lint([1, 2], LintContext())
    assert problem.severity == "error" and "JSON object" in problem.message

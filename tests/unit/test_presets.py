"""ds_configs/ is generated: regenerate and diff; every preset parses with DeepSpeed's own DeepSpeedConfig."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from zero_kit.config.builder import bucket_sizes
from zero_kit.config.presets import PRESETS, PRESETS_DIR, write_presets

PRESET_FILES = sorted(PRESETS_DIR.glob("*.json"))


def test_presets_are_exactly_what_the_generator_writes(tmp_path):
    written = write_presets(tmp_path)
    assert sorted(p.name for p in PRESET_FILES) == sorted(p.name for p in written), (
        "regenerate: python -m zero_kit.config.presets"
    )
    for fresh in written:
        committed = PRESETS_DIR / fresh.name
        assert committed.read_text() == fresh.read_text(), f"{committed} drifted: run python -m zero_kit.config.presets"


def test_the_required_presets_exist():
    names = set(PRESETS)
    assert {"zero0", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"} <= names
    assert {n for n in names if n.startswith("hf_")}, "HF-auto variants are missing"


def _parse_with_deepspeed(config: dict, world_size: int, monkeypatch):
    """DeepSpeed's own parse, at a world size, without a process group (it asks deepspeed.comm)."""
    from deepspeed.runtime import config as ds_config_module

    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config_module.dist, "get_world_size", lambda *a, **k: world_size)
    return ds_config_module.DeepSpeedConfig(json.loads(json.dumps(config)))


def _resolve_hf_auto(config: dict, world_size: int) -> dict:
    """Fill "auto" exactly as the HF Trainer does (HfTrainerDeepSpeedConfig), with typical TrainingArguments."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    args = SimpleNamespace(
        world_size=world_size,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        max_grad_norm=1.0,
        learning_rate=2e-5,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        save_on_each_node=False,
        fp16=False,
        fp16_full_eval=False,
        fp16_backend="auto",  # read by transformers 4.x (apex era)
        fp16_opt_level="O1",
        bf16=True,
        bf16_full_eval=False,
        get_warmup_steps=lambda n: 0,
    )
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=4096)), 100)
        return hf.config
    finally:
        unset_hf_deepspeed_config()


@pytest.mark.parametrize("path", PRESET_FILES, ids=[p.stem for p in PRESET_FILES])
@pytest.mark.parametrize("world_size", [1, 2, 16])
def test_every_preset_parses_with_deepspeed(path, world_size, monkeypatch):
    config = json.loads(path.read_text())
    if path.stem.startswith("hf_"):
        assert "auto" in path.read_text()
        config = _resolve_hf_auto(config, world_size)
        assert '"auto"' not in json.dumps(config), "the Trainer left an auto value unfilled"
    parsed = _parse_with_deepspeed(config, world_size, monkeypatch)
    stage = config["zero_optimization"]["stage"]
    assert parsed.zero_optimization_stage == stage
    assert parsed.train_batch_size == (
        parsed.train_micro_batch_size_per_gpu * parsed.gradient_accumulation_steps * world_size
    )
    if stage == 3 and not path.stem.startswith("hf_"):
        assert parsed.zero_config.prefetch_bucket_size == bucket_sizes(4096)["stage3_prefetch_bucket_size"]
    if "offload" in path.stem:
        assert parsed.zero_config.offload_optimizer.device == "cpu"
    if "zeropp" in path.stem:
        zero = parsed.zero_config
        assert (zero.zero_hpz_partition_size, zero.zero_quantized_weights, zero.zero_quantized_gradients) == (8, 1, 1)
    if "bf16_states" in path.stem:
        bf16 = parsed.bfloat16_config
        assert bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states and parsed.torch_autocast_enabled


def test_each_preset_is_what_zero_kit_config_writes_for_the_same_flags(tmp_path, capsys):
    """The presets are built from specs; the CLI with the equivalent flags must write the same bytes."""
    import dataclasses

    from zero_kit.cli import main
    from zero_kit.config.spec import ZeroSpec

    for name, spec in PRESETS.items():
        flags = []
        for field in dataclasses.fields(ZeroSpec):
            value = getattr(spec, field.name)
            if value != field.default:
                flag = "--" + field.name.replace("_", "-")
                flags += [flag] if value is True else [flag, str(value)]
        out = tmp_path / f"{name}.json"
        assert main(["config", *flags, "-o", str(out)]) == 0
        assert out.read_text() == (PRESETS_DIR / f"{name}.json").read_text(), name


def test_the_regenerating_command_takes_help_and_writes_nothing_for_it(tmp_path, capsys):
    """`python -m zero_kit.config.presets --help` prints its usage; it once wrote the presets into ./--help/."""
    import pytest

    from zero_kit.config import presets

    with pytest.raises(SystemExit) as done:
        presets.main(["--help"])
    assert done.value.code == 0 and "directory" in capsys.readouterr().out
    presets.main([str(tmp_path / "out")])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(f"{name}.json" for name in PRESETS)

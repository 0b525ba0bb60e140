"""Real-world style configs (LLaMA-Factory, axolotl, HF docs: full of "auto") and the generated presets lint clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zero_kit.lint import LintContext, lint
from zero_kit.lint.installed import autotp_shards_from_config

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "configs"
HF_STYLE = sorted((FIXTURES / "hf-trainer").glob("*.json"))
PLAIN = sorted((FIXTURES / "deepspeed").glob("*.json"))
PRESETS = sorted((ROOT / "ds_configs").glob("*.json"))
# LLaMA-Factory writes these keys; DeepSpeed 0.19.8 never reads them, which deserves a warning, not an error.
EXPECTED_WARNINGS = {"llamafactory_style_z3_offload_extras.json": {"comms_config", "monitor_config"}}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_fixtures_exist():
    assert len(HF_STYLE) >= 6 and len(PLAIN) >= 2


@pytest.mark.parametrize("path", HF_STYLE, ids=[p.name for p in HF_STYLE])
@pytest.mark.parametrize("world_size", [None, 1, 8])
def test_hf_style_configs_lint_clean_for_hf_trainer(path, world_size):
    config = _load(path)
    problems = lint(config, LintContext(world_size=world_size, target="hf-trainer"))
    expected = EXPECTED_WARNINGS.get(path.name, set())
    if config["zero_optimization"]["stage"] == 3 and "train_batch_size" in config and world_size != 1:
        expected = expected | {"train_batch_size"}  # zero.Init on CPU ranks fails on it (tests/unit/test_hf_batch_key)
    refused = set()
    tp = config.get("tensor_parallel", {}).get("autotp_size", 1)
    if tp > 1 and (world_size is not None or not autotp_shards_from_config()):
        # 1 rank: DeepSpeed's (world // tp, tp) mesh cannot be built, the run fails (tests/dist/test_autotp_world.py);
        # 8 ranks: a tensor-parallel group shares its samples, which DeepSpeed's batch check does not count;
        # DeepSpeed < 0.19 (the oldest set): the config alone shards nothing, the script must call tp_model_init
        expected = expected | {"tensor_parallel.autotp_size"}
        refused = {"tensor_parallel.autotp_size"} if world_size == 1 else set()
    assert {p.path for p in problems} == expected, [str(p) for p in problems]
    assert {p.path for p in problems if p.severity == "error"} == refused, [str(p) for p in problems]


@pytest.mark.parametrize("path", HF_STYLE, ids=[p.name for p in HF_STYLE])
def test_hf_style_configs_are_refused_for_plain_deepspeed(path):
    problems = lint(_load(path), LintContext(world_size=8, target="deepspeed"))
    assert any(p.severity == "error" and p.value == "auto" for p in problems)


@pytest.mark.parametrize("path", PLAIN, ids=[p.name for p in PLAIN])
def test_plain_configs_lint_clean_at_their_world_size(path):
    assert lint(_load(path), LintContext(world_size=4)) == []
    # The same file at a world size that breaks its batch triple is refused (when the triple is pinned).
    config = _load(path)
    if all(k in config for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")):
        assert any(p.path == "train_batch_size" for p in lint(config, LintContext(world_size=3)))


def test_presets_lint_clean():
    """Every generated preset under ds_configs/ (once the generator has written them) lints clean."""
    generator_exists = (ROOT / "zero_kit" / "presets.py").exists()
    assert PRESETS or not generator_exists, "the preset generator exists but ds_configs/ is empty"
    for path in PRESETS:
        target = "hf-trainer" if path.name.startswith("hf_") else "deepspeed"
        problems = lint(_load(path), LintContext(world_size=None, target=target))
        assert problems == [], (path.name, [str(p) for p in problems])

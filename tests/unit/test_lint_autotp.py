"""The AutoTP rules (zero_kit.lint.rules_tp) against the installed DeepSpeed's own code: its engine's stage check and
tp_size check run on a stand-in engine, its config's batch check at a world size, its mesh arithmetic and its head
split. Under the newest set (0.19.8) and the compatibility job's oldest (0.18.3) each test asserts what that
DeepSpeed does and that the linter says the same."""

from __future__ import annotations

import inspect
import types

import pytest

from zero_kit.lint import LintContext, check_rules
from zero_kit.lint.installed import autotp_refuses_zero3, autotp_shards_from_config

BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True}}


def _config(stage: int, size: int, **extra) -> dict:
    return {**BASE, "zero_optimization": {"stage": stage}, "tensor_parallel": {"autotp_size": size, **extra}}


def _errors(config: dict, **context) -> list[str]:
    return [p.message for p in check_rules(config, LintContext(**context)) if p.severity == "error"]


def _engine_stand_in(stage: int, tp: int):
    import torch

    return types.SimpleNamespace(
        _set_client_model=lambda model: None,
        zero_optimization_stage=lambda: stage,
        autotp_size=lambda: tp,
        module=torch.nn.Linear(2, 2),
        local_rank=-1,
    )


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_stage_rule_is_the_installed_engines_check(stage, monkeypatch):
    """DeepSpeedEngine._configure_tensor_parallel_states on a stand-in engine (groups mocked: no process group)."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.utils import groups

    monkeypatch.setattr(groups, "_init_tp_mesh_device", lambda **kwargs: None)
    try:
        DeepSpeedEngine._configure_tensor_parallel_states(_engine_stand_in(stage, 2), None)
        refused = False
    except AssertionError as err:
        refused = "zero_stage = 3" in str(err)
    assert refused == (stage == 3 and autotp_refuses_zero3())
    errors = _errors(_config(stage, 2))
    assert bool([e for e in errors if "stage 3" in e]) == refused


def test_tp_size_mismatch_is_the_installed_engines_check():
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.tensor_parallel.config import get_tensor_parallel_config

    config = _config(1, 2, tp={"tp_size": 4})
    tp_config = get_tensor_parallel_config(config)
    if autotp_shards_from_config():
        with pytest.raises(ValueError, match=r"tp_size \(4\) does not match"):
            DeepSpeedEngine._apply_autotp_partitioning(_engine_stand_in(1, 2), object(), tp_config)
        assert any("does not match autotp_size" in e for e in _errors(config))
    else:  # 0.18.3 never compares them
        assert not hasattr(DeepSpeedEngine, "_apply_autotp_partitioning")
        assert not _errors(config)


@pytest.mark.parametrize(("world", "tp"), [(6, 4), (8, 3)])
def test_world_not_divisible_leaves_ranks_out_of_deepspeeds_mesh(world, tp, monkeypatch):
    """groups._init_tp_mesh_device asks for a (world // tp) x tp mesh: fewer ranks than the world (the ranks left out
    fail at start-up; tests/dist/test_autotp_world.py runs it on real ranks)."""
    from deepspeed.utils import groups

    asked = []
    mesh = types.SimpleNamespace(get_group=lambda mesh_dim: mesh_dim)
    monkeypatch.setattr(groups, "_TENSOR_MODEL_PARALLEL_GROUP", None)
    monkeypatch.setattr(groups.dist, "get_world_size", lambda group=None: world)
    monkeypatch.setattr(groups.dist, "initialize_mesh_device", lambda shape, names: asked.append(shape) or mesh)
    monkeypatch.setattr(groups, "_DATA_PARALLEL_GROUP", None)
    monkeypatch.setattr(groups, "_MODEL_PARALLEL_GROUP", None)
    groups._init_tp_mesh_device(tensor_model_parallel_size=tp)
    (shape,) = asked
    assert shape == (world // tp, tp) and shape[0] * shape[1] < world
    (error,) = _errors(_config(1, tp), world_size=world)
    assert f"does not divide the world size({world}" in error and f"{world % tp} rank(s) outside it" in error


def test_batch_is_checked_against_every_rank_not_the_data_parallel_ones(monkeypatch):
    """DeepSpeedConfig without an mpu counts dist.get_world_size(): train_batch_size = micro x accum x ALL ranks."""
    from deepspeed.runtime import config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda group=None: 8)
    ds_config.DeepSpeedConfig({**_config(1, 2), "train_batch_size": 8})
    with pytest.raises(AssertionError, match="4 != 1 \\* 1 \\* 8"):
        ds_config.DeepSpeedConfig({**_config(1, 2), "train_batch_size": 4})
    assert not _errors({**_config(1, 2), "train_batch_size": 8}, world_size=8)
    assert _errors({**_config(1, 2), "train_batch_size": 4}, world_size=8)
    warnings = [p.message for p in check_rules(_config(1, 2), LintContext(world_size=8)) if p.severity == "warning"]
    assert any("= 4 distinct samples" in w for w in warnings)


def _shards(total: int, tp: int, kv_heads: int) -> list[int]:
    """DeepSpeed's own split of a q/k/v projection of `total` rows (tp_shard.get_shard_size, either signature)."""
    from deepspeed.module_inject import tp_shard

    if "meta" in inspect.signature(tp_shard.get_shard_size).parameters:  # 0.19.8: per-model meta
        meta = tp_shard.AutoTPMeta(num_kv_heads=kv_heads)
        return [tp_shard.get_shard_size(total, tp, meta, "q_proj", rank) for rank in range(tp)]
    tp_shard.set_num_kv_heads(kv_heads)  # 0.18.3: module globals
    try:
        return [tp_shard.get_shard_size(total, tp, "q_proj", rank) for rank in range(tp)]
    finally:
        tp_shard.set_num_kv_heads(None)


@pytest.mark.parametrize(("tp", "kv", "warned"), [(2, 8, None), (3, 8, "does not divide"), (16, 8, "exceeds")])
def test_head_split_is_deepspeeds(tp, kv, warned):
    head_dim = 128
    shards = _shards(32 * head_dim, tp, kv)
    assert sum(shards) == 32 * head_dim
    even = len(set(shards)) == 1
    assert even == (warned is None)
    if warned == "exceeds":
        assert shards.count(0) == tp - kv  # ranks beyond the kv heads hold no attention shard
    context = LintContext(world_size=16 * 3, attention_heads=32, kv_heads=kv)
    messages = [p.message for p in check_rules(_config(1, tp), context) if p.severity == "warning"]
    assert any(warned in m for m in messages) if warned else not any("heads" in m for m in messages)


def test_no_autotp_no_rules():
    for tp in (0, 1):
        assert not check_rules(_config(3, tp), LintContext(world_size=3, kv_heads=1))

"""The linter's ZeRO++ and low-precision-state rules, each next to the DeepSpeed code that makes it a rule (reproduced
here without a process group), plus: the configs that work stay clean, and a CPU `zero-kit train` refuses a
--ds-config with qwZ/qgZ before any work."""

from __future__ import annotations

import copy
import inspect
import json
from types import SimpleNamespace

import pytest

from zero_kit.errors import UserError
from zero_kit.lint import LintContext, lint

BASE = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 3},
}


def config_with(zero: dict | None = None, **top) -> dict:
    config = copy.deepcopy(BASE)
    config["zero_optimization"].update(zero or {})
    for key, value in top.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def found(config: dict, **context) -> list[tuple[str, str, str]]:
    return [(p.severity, p.path, p.message) for p in lint(config, LintContext(**context))]


def _parse_with_deepspeed(config: dict, world_size: int, monkeypatch):
    from deepspeed.runtime import config as ds_config_module

    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config_module.dist, "get_world_size", lambda *a, **k: world_size)
    return ds_config_module.DeepSpeedConfig(json.loads(json.dumps(config)))


WORKING = [
    ({"zero_hpz_partition_size": 2}, {}, {"world_size": 4}),  # measured: runs on 4 CPU ranks, losses = ZeRO-3
    ({"zero_hpz_partition_size": 8, "zero_quantized_weights": True, "zero_quantized_gradients": True}, {},
     {"world_size": 16, "ranks_per_node": 8, "device": "cuda"}),
    ({"zero_hpz_partition_size": 1, "zero_quantized_weights": False}, {}, {"world_size": 4, "device": "cpu"}),
    ({}, {"bf16": {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
          "torch_autocast": {"enabled": True, "dtype": "bfloat16"}}, {"world_size": 2, "device": "cpu"}),
    ({"offload_optimizer": {"device": "cpu"}}, {"bf16": {"bf16_master_weights_and_grads": True}}, {"world_size": 2}),
]  # fmt: skip


@pytest.mark.parametrize(("zero", "top", "context"), WORKING)
def test_configs_that_work_are_clean(zero, top, context):
    assert found(config_with(zero, **top), **context) == []


def test_deepspeed_parse_accepts_zeropp_below_stage_3_which_is_why_the_linter_speaks(monkeypatch):
    config = config_with({"stage": 2, "zero_hpz_partition_size": 2, "zero_quantized_gradients": True})
    _parse_with_deepspeed(config, 4, monkeypatch)  # no complaint from DeepSpeed: both are ignored at stage 2
    problems = found(config, world_size=4)
    assert {p[1] for p in problems if p[0] == "error"} == {
        "zero_optimization.zero_hpz_partition_size",
        "zero_optimization.zero_quantized_gradients",
    }
    assert all("stage 3" in p[2] or "ZeRO-3" in p[2] for p in problems)


def test_hpz_size_must_divide_the_world_size_as_deepspeed_asserts():
    from deepspeed.utils.groups import _ensure_divisibility  # what _create_zero_param_parallel_group calls

    with pytest.raises(AssertionError):
        _ensure_divisibility(6, 4)
    [problem] = found(config_with({"zero_hpz_partition_size": 4}), world_size=6)
    assert problem[:2] == ("error", "zero_optimization.zero_hpz_partition_size") and "world size 6" in problem[2]
    assert found(config_with({"zero_hpz_partition_size": 4})) == []  # world size unknown: not judged


def test_hpz_size_above_the_world_or_across_nodes_is_a_warning():
    [bigger] = found(config_with({"zero_hpz_partition_size": 8}), world_size=4)
    assert bigger[0] == "warning" and "shrinks it to 4" in bigger[2]
    [across] = found(config_with({"zero_hpz_partition_size": 4}), world_size=12, ranks_per_node=6)
    assert across[0] == "warning" and "span two nodes" in across[2]


def test_quantized_features_are_refused_on_cpu_as_deepspeed_fails_there():
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("QuantizerBuilder")
    if get_accelerator().device_name() == "cpu":  # the kernels qwZ/qgZ load: not built for the CPU accelerator
        with pytest.raises(ValueError, match="not been implemented on CPU backend"):
            builder.load()
    config = config_with({"zero_quantized_weights": True, "zero_quantized_nontrainable_weights": True,
                          "zero_quantized_gradients": True})  # fmt: skip
    problems = found(config, world_size=2, device="cpu")
    assert [p[1].split(".")[-1] for p in problems] == [
        "zero_quantized_weights",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_gradients",
    ]
    assert all(p[0] == "error" and "needs CUDA" in p[2] for p in problems)
    assert found(config, world_size=2) == [] and found(config, world_size=2, device="cuda") == []


def test_autocast_with_quantized_weights_is_refused_as_deepspeed_asserts():
    from deepspeed.runtime.torch_autocast import _validate_auto_cast_settings

    with pytest.raises(AssertionError, match="Cannot enable both torch autocast and zero quantized weights"):
        _validate_auto_cast_settings(SimpleNamespace(zero_quantized_weights=lambda: True))
    config = config_with({"zero_quantized_weights": True}, torch_autocast={"enabled": True, "dtype": "bfloat16"})
    assert [p[:2] for p in found(config, world_size=2)] == [("error", "torch_autocast.enabled")]


def _master_weights_check(states: bool, offload: bool) -> bool:
    """True when DeepSpeed's `_configure_master_weights` demands optimizer offload with DeepSpeedCPUAdam."""
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    demanded = []
    optimizer = SimpleNamespace(optimizer=SimpleNamespace(fp32_optimizer_states=False))
    accepted = inspect.signature(ZeROOptimizer._configure_master_weights).parameters
    kwargs = {"bf16_master_weights_and_gradients": True, "bf16_optimizer_states": states,
              "offload_enabled": offload,  # 0.19: also checks the bf16-states + offload case
              "bf16_offload_validator": lambda: demanded.append(True),  # 0.19's name
              "bf16_fp32_offload_validator": lambda: demanded.append(True)}  # 0.18's name  # fmt: skip
    ZeROOptimizer._configure_master_weights(optimizer, **{k: v for k, v in kwargs.items() if k in accepted})
    return bool(demanded)


def test_bf16_master_weights_need_bf16_states_or_offload_as_deepspeed_asserts():
    assert _master_weights_check(states=False, offload=False)  # DeepSpeed: "requires ZeRO Offload ..."
    assert not _master_weights_check(states=True, offload=False)
    [problem] = found(config_with(bf16={"bf16_master_weights_and_grads": True}), world_size=2)
    assert problem[:2] == ("error", "bf16.bf16_master_weights_and_grads") and "DeepSpeedCPUAdam" in problem[2]


def test_bf16_optimizer_states_alone_is_refused_by_deepspeed_parse_and_named_here(monkeypatch):
    config = config_with(bf16={"bf16_optimizer_states": True})
    with pytest.raises(AssertionError, match="requires bf16_master_weights_and_grads"):
        _parse_with_deepspeed(config, 2, monkeypatch)
    problems = found(config, world_size=2)
    assert ("error", "bf16.bf16_optimizer_states") in [p[:2] for p in problems]
    stage0 = config_with({"stage": 0}, bf16={"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True})
    assert any("stage 1, 2 or 3" in p[2] for p in found(stage0, world_size=2))


def test_cpu_train_refuses_a_ds_config_with_qwz_before_any_work(tmp_path):
    from zero_kit.train.options import TrainOptions
    from zero_kit.train.plan import trainer_ds_config

    hf = {**BASE, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    hf["zero_optimization"] = {"stage": 3, "zero_quantized_weights": True}
    path = tmp_path / "qwz.json"
    path.write_text(json.dumps(hf))
    opts = TrainOptions(ds_config=str(path))
    with pytest.raises(UserError, match="zero_quantized_weights .*needs CUDA"):
        trainer_ds_config(opts, torch_adam=True, device="cpu")
    assert trainer_ds_config(opts, device="cuda")["zero_optimization"]["zero_quantized_weights"] is True


def test_validate_cli_takes_the_device_and_gpus_per_node(tmp_path, capsys):
    from zero_kit.cli import main

    path = tmp_path / "zpp.json"
    path.write_text(json.dumps(config_with({"zero_hpz_partition_size": 4, "zero_quantized_gradients": True})))
    assert main(["validate", str(path), "--world-size", "16", "--gpus-per-node", "8", "--device", "cuda"]) == 0
    capsys.readouterr()
    assert main(["validate", str(path), "--world-size", "16", "--device", "cpu"]) == 1
    assert "needs CUDA" in capsys.readouterr().out
    assert main(["validate", str(path), "--world-size", "12", "--gpus-per-node", "6"]) == 0
    assert "span two nodes" in capsys.readouterr().out


def test_module_granularity_on_cpu_is_refused_as_deepspeed_fails_there():
    """A 2-rank CPU ZeRO-3 run with stage3_module_granularity_threshold 50000 (the bench's 3.1M model) fails at its
    first step in DeepSpeed 0.19.8's zero_grad: a gradient the grouped modules keep reaches record_stream. The
    failing call, on DeepSpeed's own code: zero_grad with a CPU gradient left on a parameter."""
    import torch
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    param = torch.nn.Parameter(torch.zeros(4))
    param.grad = torch.ones(4)
    if get_accelerator().device_name() == "cpu":
        with pytest.raises(RuntimeError, match="unknown parameter type"):
            DeepSpeedZeroOptimizer_Stage3.zero_grad(SimpleNamespace(fp16_groups=[[param]]), set_to_none=True)
    config = config_with({"stage": 3, "stage3_module_granularity_threshold": 50000})
    [problem] = found(config, world_size=2, device="cpu")
    assert problem[:2] == ("error", "zero_optimization.stage3_module_granularity_threshold")
    assert "unknown parameter type" in problem[2]
    assert found(config, world_size=2, device="cuda") == [] and found(config, world_size=2) == []
    assert found(config_with({"stage": 3, "stage3_module_granularity_threshold": 0}), world_size=2, device="cpu") == []


def test_deepspeeds_default_reduce_bucket_on_cpu_ranks_is_a_warning():
    """ZeRO-1/2 with DeepSpeed's default 5e8-element reduce bucket on CPU ranks: 1.63 s a step against 0.04 s with a
    model-sized one (zero-kit bench --ds-config on a `zero-kit config` file without --hidden-size), 0.06-0.10x DDP
    (benchmarks/comm_buckets). DeepSpeed's own default is what an unset key gets."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(stage=2).reduce_bucket_size == 500_000_000
    for stage in (1, 2):
        for bucket in ({}, {"reduce_bucket_size": 500_000_000}):
            [problem] = found(config_with({"stage": stage, **bucket}), world_size=2, device="cpu")
            assert problem[:2] == ("warning", "zero_optimization.reduce_bucket_size"), problem
        assert found(config_with({"stage": stage, "reduce_bucket_size": 921_600}), world_size=2, device="cpu") == []
        assert found(config_with({"stage": stage}), world_size=2, device="cuda") == []
        auto = config_with({"stage": stage, "reduce_bucket_size": "auto"})
        problems = found(auto, world_size=2, device="cpu", target="hf-trainer")  # the Trainer fills h²
        assert "zero_optimization.reduce_bucket_size" not in [p[1] for p in problems], problems

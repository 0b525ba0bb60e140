"""The generator's ZeRO++ (hpZ, qwZ, qgZ) and low-precision state options: what it writes, what it refuses (naming
the flag and the reason), and that DeepSpeed's own config model takes what it writes."""

from __future__ import annotations

import json

import pytest

from zero_kit.cli import main
from zero_kit.config import ZeroSpec, build_ds_config, generate
from zero_kit.errors import UserError


def _parse_with_deepspeed(config: dict, world_size: int, monkeypatch):
    from deepspeed.runtime import config as ds_config_module

    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config_module.dist, "get_world_size", lambda *a, **k: world_size)
    return ds_config_module.DeepSpeedConfig(json.loads(json.dumps(config)))


def test_multi_node_hpz_defaults_to_the_gpus_per_node(monkeypatch):
    spec = ZeroSpec(stage=3, nodes=4, gpus_per_node=8, hpz=True, quantized_weights=True, quantized_gradients=True)
    config = build_ds_config(spec)
    zero = config["zero_optimization"]
    assert (zero["zero_hpz_partition_size"], zero["zero_quantized_weights"], zero["zero_quantized_gradients"]) == (
        8,
        True,
        True,
    )
    parsed = _parse_with_deepspeed(config, 32, monkeypatch).zero_config
    assert (parsed.zero_hpz_partition_size, parsed.zero_quantized_weights, parsed.zero_quantized_gradients) == (
        8,
        True,
        True,
    )


def test_an_explicit_partition_size_implies_hpz_and_wins():
    zero = build_ds_config(ZeroSpec(stage=3, world_size=4, hpz_partition_size=2))["zero_optimization"]
    assert zero["zero_hpz_partition_size"] == 2  # the measured CPU case: hpZ 2 on 4 ranks
    assert "zero_quantized_weights" not in zero


def test_nothing_changes_when_the_options_are_off():
    config = build_ds_config(ZeroSpec(stage=3, nodes=2, gpus_per_node=8))
    assert not any(k.startswith("zero_") for k in config["zero_optimization"])
    assert set(config["bf16"]) == {"enabled"} and "torch_autocast" not in config


def test_low_precision_states_and_autocast_parse_with_deepspeed(monkeypatch):
    spec = ZeroSpec(stage=3, bf16_master_weights=True, bf16_optimizer_states=True, torch_autocast=True)
    config = build_ds_config(spec)
    assert config["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    assert config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    parsed = _parse_with_deepspeed(config, 2, monkeypatch)
    assert parsed.bfloat16_config.bf16_optimizer_states and parsed.torch_autocast_enabled
    assert str(parsed.torch_autocast_dtype) == "torch.bfloat16"


def test_bf16_master_weights_alone_is_fine_with_optimizer_offload():
    config = build_ds_config(ZeroSpec(stage=2, bf16_master_weights=True, offload_optimizer="cpu"))
    assert config["bf16"]["bf16_master_weights_and_grads"] is True
    assert "bf16_optimizer_states" not in config["bf16"]


def test_hf_auto_keeps_the_options():
    config = build_ds_config(ZeroSpec(stage=3, hf_auto=True, hpz_partition_size=8, bf16_master_weights=True,
                                      bf16_optimizer_states=True))  # fmt: skip
    assert config["bf16"]["enabled"] == "auto" and config["bf16"]["bf16_optimizer_states"] is True
    assert config["zero_optimization"]["zero_hpz_partition_size"] == 8


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        (ZeroSpec(stage=2, hpz_partition_size=2), ["--hpz-partition-size 2", "at stage 2 DeepSpeed ignores it",
                                                   "fix: set --stage 3"]),
        (ZeroSpec(stage=1, quantized_weights=True, quantized_gradients=True),
         ["--quantized-weights:", "--quantized-gradients:", "ZeRO-3's parameter partitioning", "set --stage 3"]),
        (ZeroSpec(stage=3, hpz=True), ["--hpz needs a partition size", "--nodes > 1"]),
        (ZeroSpec(stage=3, hpz=True, world_size=8), ["--hpz needs a partition size"]),
        (ZeroSpec(stage=3, hpz_partition_size=1), ["at least 2"]),
        (ZeroSpec(stage=3, world_size=8, hpz_partition_size=3), ["does not divide the world size 8", "asserts"]),
        (ZeroSpec(stage=3, quantized_weights=True, device="cpu"), ["--quantized-weights: needs CUDA", "CPU backend"]),
        (ZeroSpec(stage=3, quantized_gradients=True, device="cpu"), ["--quantized-gradients: needs CUDA"]),
        (ZeroSpec(stage=3, quantized_weights=True, torch_autocast=True), ["Cannot enable both torch autocast"]),
        (ZeroSpec(stage=3, torch_autocast=True, precision="fp16"), ["--torch-autocast with --precision fp16"]),
        (ZeroSpec(stage=3, bf16_optimizer_states=True), ["needs --bf16-master-weights"]),
        (ZeroSpec(stage=3, bf16_master_weights=True), ["--bf16-master-weights", "requires ZeRO Offload",
                                                       "--offload-optimizer cpu"]),
        (ZeroSpec(stage=0, bf16_master_weights=True, bf16_optimizer_states=True),
         ["--bf16-master-weights: needs ZeRO stage 1, 2 or 3", "--bf16-optimizer-states: needs", "set --stage 1"]),
        (ZeroSpec(stage=3, precision="fp16", bf16_master_weights=True, bf16_optimizer_states=True),
         ["need --precision bf16 (got fp16)"]),
    ],
)  # fmt: skip
def test_what_cannot_work_is_refused_with_the_reason(spec, fragments):
    with pytest.raises(UserError) as err:
        build_ds_config(spec)
    text = f"{err.value}"
    for fragment in fragments:
        assert fragment in text, text


def test_cuda_is_assumed_unless_the_user_says_cpu(capsys):
    """Writing a GPU cluster's config on a laptop is the ordinary case: qwZ/qgZ are refused only for --device cpu,
    never because the machine running `zero-kit config` has no GPU."""
    assert main(["config", "--stage", "3", "--quantized-weights", "--quantized-gradients"]) == 0
    assert json.loads(capsys.readouterr().out)["zero_optimization"]["zero_quantized_weights"] is True
    code = main(["config", "--stage", "3", "--quantized-weights", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "--quantized-weights: needs CUDA" in err and "Traceback" not in err


def test_every_problem_is_reported_at_once(capsys):
    code = main(
        ["config", "--stage", "2", "--hpz", "--quantized-weights", "--device", "cpu", "--bf16-optimizer-states"]
    )
    err = capsys.readouterr().err
    # Five since the linter's rules speak per key: --quantized-weights at stage 2 and on CPU are two problems, and
    # --device cpu's precision is fp32, where bf16 states have no section to live in.
    assert code == 2 and "5 problems" in err, err
    for named in ("--hpz needs a partition size", "--quantized-weights: ZeRO++", "--quantized-weights: needs CUDA",
                  "--bf16-optimizer-states needs --bf16-master-weights", "needs --precision bf16 (got fp32)"):  # fmt: skip
        assert named in err, err


def test_hpz_spanning_nodes_is_a_warning_in_config_as_in_validate():
    """DeepSpeed only asserts that the partition size divides the world size (utils/groups.py): a secondary shard
    across two nodes runs, slower. So `zero-kit config` writes it and warns, as `zero-kit validate` does."""
    generated = generate(ZeroSpec(stage=3, nodes=2, gpus_per_node=8, hpz_partition_size=16))
    assert generated.config["zero_optimization"]["zero_hpz_partition_size"] == 16
    (warning,) = generated.warnings
    assert "--hpz-partition-size 16" in warning and "does not divide the 8 ranks per node" in warning
    assert "fix: use 8" in warning


def test_config_and_validate_both_warn_on_hpz_spanning_nodes(tmp_path, capsys):
    """End to end: `zero-kit config` writes the file and prints the linter's warning on stderr (stdout stays the
    JSON); `zero-kit validate` of that file at the same shape gives the same warning and passes."""
    out = tmp_path / "ds.json"
    argv = ["config", "--stage", "3", "--nodes", "2", "--gpus-per-node", "8", "--hpz-partition-size", "16"]
    assert main([*argv, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "zero-kit config: warning: --hpz-partition-size 16" in err and "ranks per node" in err, err
    assert main(["validate", str(out), "--world-size", "16", "--gpus-per-node", "8"]) == 0
    text = capsys.readouterr().out
    assert "OK (0 error(s), 1 warning(s))" in text and "ranks per node" in text, text

"""The Python API for people with their own Trainer script (zero_kit.hf)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from zero_kit.errors import UserError
from zero_kit.hf import ThroughputCallback, deepspeed_config
from zero_kit.train.options import TrainOptions
from zero_kit.train.plan import adopt_file_values


def test_deepspeed_config_from_cli_options_leaves_batch_to_the_trainer():
    config = deepspeed_config(stage=3, offload_optimizer="cpu")
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["train_micro_batch_size_per_gpu"] == "auto"


def test_ds_config_file_is_linted_and_bad_files_are_user_errors(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(deepspeed_config(stage=2)))
    assert deepspeed_config(ds_config=str(good))["zero_optimization"]["stage"] == 2
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        deepspeed_config(ds_config=str(broken))
    with pytest.raises(UserError, match="cannot read"):
        deepspeed_config(ds_config=str(tmp_path / "missing.json"))


def test_concrete_file_values_win_over_untouched_flags():
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 2,
        "optimizer": {"params": {"lr": 3e-5}},
    }
    opts = adopt_file_values(TrainOptions(grad_accum=2), config)
    assert (opts.micro_batch, opts.grad_accum, opts.lr) == (8, 2, 3e-5)
    with pytest.raises(UserError, match="--grad-accum 4 vs 2"):
        adopt_file_values(TrainOptions(grad_accum=4, ds_config="f.json"), config)


def test_throughput_callback_adds_tokens_per_second():
    callback = ThroughputCallback()
    state = SimpleNamespace(num_input_tokens_seen=0)
    args = SimpleNamespace(world_size=2, bf16=False, fp16=False)
    callback.on_train_begin(args, state, None)
    state.num_input_tokens_seen = 5000
    logs = {"loss": 1.0}
    callback.on_log(args, state, None, logs=logs)
    assert logs["tokens_per_s"] > 0 and "mfu" not in logs  # no GPU: MFU is not claimed


def test_training_arguments_names_every_bad_input_before_setting_anything_up(monkeypatch):
    import os

    from zero_kit.hf import training_arguments

    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    before = dict(os.environ)
    with pytest.raises(UserError) as err:
        training_arguments("out", stage=3, precision="bf17", deepspeed={}, bf16=True, fp16=True)
    text = str(err.value)
    assert text.startswith("4 problems in training_arguments()"), text
    for part in ("precision='bf17'", "bf16=True, fp16=True", "deepspeed= is what", "ACCELERATE_USE_CPU=1"):
        assert part in text
    assert dict(os.environ) == before  # no launcher variables, no TORCH_EXTENSIONS_DIR: nothing was set up
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    with pytest.raises(UserError, match="--ds-config was given together with --stage"):
        training_arguments("out", stage=3, ds_config="x.json")  # zero-kit train's own check of its options


def test_use_cpu_and_backend_must_fit_the_machine():
    from zero_kit.hf import _machine_problems

    assert _machine_problems({"use_cpu": True, "ddp_backend": "gloo"}, on_gpu=False) == []
    (problem,) = _machine_problems({"use_cpu": False}, on_gpu=False)
    assert "use_cpu=False does not fit a host without CUDA" in problem.message and problem.fix == "drop use_cpu="
    (problem,) = _machine_problems({"use_cpu": True, "ddp_backend": "nccl"}, on_gpu=True)
    assert "use_cpu=True does not fit a GPU rank" in problem.message


def test_accelerate_use_cpu_turns_deepspeed_off_in_accelerate(monkeypatch):
    """Why training_arguments refuses ACCELERATE_USE_CPU: accelerate's own AcceleratorState, given the DeepSpeed
    plugin the Trainer passes, runs without DeepSpeed when the variable is set (and with it when it is not)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "false")  # Accelerator sets it; restored after the test
    found = {}
    try:
        for flag in ("0", "1"):
            monkeypatch.setenv("ACCELERATE_USE_CPU", flag)
            AcceleratorState._reset_state(reset_partial_state=True)
            plugin = DeepSpeedPlugin(hf_ds_config=deepspeed_config(stage=2))
            found[flag] = Accelerator(deepspeed_plugin=plugin).distributed_type
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert found == {"0": DistributedType.DEEPSPEED, "1": DistributedType.NO}


def test_on_a_host_without_cuda_bf16_and_use_cpu_false_are_refused(monkeypatch):
    import os

    import torch

    from zero_kit.hf import training_arguments

    assert not torch.cuda.is_available()  # the unit tier runs on CPU hosts
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)  # as a launcher would: nothing for training_arguments to add
    before = dict(os.environ)
    with pytest.raises(UserError, match="bf16 needs a GPU"):
        training_arguments("out", stage=2, bf16=True)
    with pytest.raises(UserError, match="use_cpu=False does not fit a host without CUDA"):
        training_arguments("out", stage=2, use_cpu=False)
    assert dict(os.environ) == before


def test_finish_runs_the_scripts_atexit_handlers_and_leaves_with_its_code(tmp_path):
    """finish() is os._exit after the exit handlers: a tracker's atexit flush still runs, output is not lost, and
    the code is the one given (a world of one: no process group to end)."""
    import subprocess
    import sys

    mark = tmp_path / "flushed"
    script = (
        "import atexit, pathlib\nfrom zero_kit.hf import finish\n"
        f"atexit.register(pathlib.Path({str(mark)!r}).write_text, 'yes')\n"
        "print('last line', end='')\nfinish(3)\nprint('never')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout == "last line" and mark.read_text() == "yes"

"""The config builder: batch arithmetic, buckets, offload/precision rules, HF auto mode, CLI edge."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zero_kit.cli import main
from zero_kit.config.builder import bucket_sizes, build_ds_config, dumps, resolve_batch, resolve_world_size
from zero_kit.config.spec import ZeroSpec
from zero_kit.errors import BatchSizeError, UserError


@pytest.mark.parametrize(
    ("micro", "accum", "global_", "world", "expected"),
    [
        (None, None, None, 8, (1, 1, 8)),
        (4, None, None, 2, (4, 1, 8)),
        (None, 8, None, 2, (1, 8, 16)),
        (2, 4, None, 8, (2, 4, 64)),
        (2, None, 64, 8, (2, 4, 64)),
        (None, 4, 64, 8, (2, 4, 64)),
        (None, None, 64, 8, (8, 1, 64)),
        (2, 4, 64, 8, (2, 4, 64)),
        (1, 1, 1, 1, (1, 1, 1)),
    ],
)
def test_any_two_of_the_batch_triple_give_the_third(micro, accum, global_, world, expected):
    batch = resolve_batch(micro, accum, global_, world)
    assert (batch.micro_batch, batch.grad_accum, batch.global_batch) == expected
    assert batch.micro_batch * batch.grad_accum * world == batch.global_batch


@pytest.mark.parametrize(
    ("micro", "accum", "global_", "world", "fragments"),
    [
        (2, 4, 60, 8, ["60", "2 x grad accum 4 x world size 8 = 64", "--global-batch 64"]),
        (3, None, 64, 8, ["not divisible", "3 x world size 8 = 24", "48 or 72"]),
        (None, 3, 64, 8, ["grad accum 3", "= 24"]),
        (None, None, 12, 8, ["not divisible", "= 8", "8 or 16"]),
        (0, None, None, 2, ["--micro-batch must be a positive integer, got 0"]),
        (None, -1, None, 2, ["--grad-accum"]),
        (None, None, 0, 2, ["--global-batch"]),
    ],
)
def test_impossible_batches_are_refused_with_the_numbers(micro, accum, global_, world, fragments):
    with pytest.raises(BatchSizeError) as err:
        resolve_batch(micro, accum, global_, world)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_world_size_from_nodes_and_gpus_and_disagreement():
    assert resolve_world_size(None, 2, 8) == 16
    assert resolve_world_size(None, None, 4) == 4
    assert resolve_world_size(16, 2, 8) == 16
    with pytest.raises(UserError, match="disagrees"):
        resolve_world_size(8, 2, 8)


def test_buckets_follow_the_hidden_size():
    """About two decoder layers (25 h²) per reduce, capped at DeepSpeed's own default (5e8); ZeRO-3's prefetch and
    persistence as the HF Trainer resolves "auto". The measurements behind it: benchmarks/comm_buckets."""
    assert bucket_sizes(4096) == {
        "reduce_bucket_size": 25 * 4096**2,
        "stage3_prefetch_bucket_size": int(0.9 * 4096**2),
        "stage3_param_persistence_threshold": 40960,
    }
    assert bucket_sizes(8192)["reduce_bucket_size"] == 500_000_000
    zero = build_ds_config(ZeroSpec(stage=3, hidden_size=64))["zero_optimization"]
    assert zero["reduce_bucket_size"] == 25 * 4096
    assert zero["stage3_prefetch_bucket_size"] == 3686
    assert zero["stage3_param_persistence_threshold"] == 640
    assert zero["overlap_comm"] is True  # ZeRO-3 overlaps everywhere
    cpu2 = build_ds_config(ZeroSpec(stage=2, hidden_size=64, device="cpu"))["zero_optimization"]
    assert cpu2["overlap_comm"] is False  # measured slower on CPU ranks
    assert build_ds_config(ZeroSpec(stage=2, hidden_size=64))["zero_optimization"]["overlap_comm"] is True
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert "stage3_prefetch_bucket_size" not in build_ds_config(ZeroSpec(stage=2, hidden_size=64))["zero_optimization"]


def test_zero3_on_cpu_ranks_keeps_no_parameter_whole():
    """On CPU ranks ZeRO-3's persistence threshold is 0: DeepSpeed all-gathers every parameter it keeps whole after
    each optimizer step, which cost the 3.1M bench model 11-19 ms a step there (benchmarks/comm_buckets). GPUs and
    the HF Trainer's "auto" keep 10 h; zero-kit train on CPU writes the 0 too."""
    from zero_kit.train.options import TrainOptions
    from zero_kit.train.plan import trainer_ds_config

    assert bucket_sizes(64, "cpu")["stage3_param_persistence_threshold"] == 0
    assert bucket_sizes(64, "cuda")["stage3_param_persistence_threshold"] == 640
    cpu3 = build_ds_config(ZeroSpec(stage=3, hidden_size=64, device="cpu"))["zero_optimization"]
    assert cpu3["stage3_param_persistence_threshold"] == 0 and cpu3["stage3_prefetch_bucket_size"] == 3686
    auto = build_ds_config(ZeroSpec(stage=3, hidden_size=64, device="cpu", hf_auto=True))["zero_optimization"]
    assert auto["stage3_param_persistence_threshold"] == "auto"
    for device, expected in (("cpu", 0), ("cuda", 640)):
        config = trainer_ds_config(TrainOptions(stage=3), device=device, hidden_size=64)
        assert config["zero_optimization"]["stage3_param_persistence_threshold"] == expected


# Each refusal names the flag and gives the fix in flags. The offload/stage and NVMe-path rules are the linter's
# (lint/rules_zero.py), worded there and reported by flag (config/rulebook.py); the last two are flag checks.
@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        (ZeroSpec(stage=2, offload_param="cpu"), ["--offload-param cpu: parameter offload needs ZeRO stage 3",
                                                  "fix: set --stage 3"]),
        (ZeroSpec(stage=0, offload_optimizer="cpu"), ["--offload-optimizer cpu", "needs ZeRO stage 1 or higher",
                                                      "fix: set --stage 1, 2 or 3"]),
        (ZeroSpec(stage=2, offload_optimizer="nvme", nvme_path="/nvme"), ["--offload-optimizer nvme",
                                                                          "NVMe optimizer offload needs ZeRO stage 3",
                                                                          "set --stage 3"]),
        (ZeroSpec(stage=3, offload_param="nvme"), ["--offload-param to NVMe needs --nvme-path", "fix: add --nvme-path"]),
        (ZeroSpec(stage=3, nvme_path="/nvme"), ["--nvme-path is only used", "fix: drop --nvme-path"]),
        (ZeroSpec(stage=2, global_batch=64), ["needs the world size", "fix: pass --world-size N"]),
    ],
)  # fmt: skip
def test_contradictions_are_refused_naming_the_flags(spec, fragments):
    with pytest.raises(UserError) as err:
        build_ds_config(spec)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_offload_sections():
    cpu = build_ds_config(ZeroSpec(stage=3, offload_optimizer="cpu", offload_param="cpu", pin_memory=False))
    assert cpu["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert cpu["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": False}
    nvme = build_ds_config(ZeroSpec(stage=3, offload_optimizer="nvme", offload_param="nvme", nvme_path="/local_nvme"))
    assert nvme["zero_optimization"]["offload_param"]["nvme_path"] == "/local_nvme"
    assert nvme["zero_optimization"]["offload_optimizer"]["device"] == "nvme"
    assert "offload_optimizer" in build_ds_config(ZeroSpec(stage=1, offload_optimizer="cpu"))["zero_optimization"]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_precision_sections(precision):
    config = build_ds_config(ZeroSpec(precision=precision))
    assert config["bf16"]["enabled"] is (precision == "bf16")
    assert config["fp16"]["enabled"] is (precision == "fp16")
    assert ("initial_scale_power" in config["fp16"]) is (precision == "fp16")


def test_batch_is_portable_without_world_size_and_complete_with_it():
    portable = build_ds_config(ZeroSpec(micro_batch=4, grad_accum=2))
    assert "train_batch_size" not in portable
    assert portable["train_micro_batch_size_per_gpu"] == 4
    full = build_ds_config(ZeroSpec(micro_batch=4, grad_accum=2, nodes=2, gpus_per_node=8))
    assert full["train_batch_size"] == 4 * 2 * 16


def test_hf_auto_marks_what_the_trainer_fills():
    config = build_ds_config(ZeroSpec(stage=3, hf_auto=True, hidden_size=4096))
    assert "train_batch_size" not in config  # DeepSpeed derives it; zero.Init on CPU ranks fails on it (issue 22)
    assert config["train_micro_batch_size_per_gpu"] == "auto"
    assert config["gradient_accumulation_steps"] == config["gradient_clipping"] == "auto"
    assert config["bf16"]["enabled"] == config["fp16"]["enabled"] == "auto"
    assert set(config["optimizer"]["params"].values()) == {"auto"}
    assert config["zero_optimization"]["reduce_bucket_size"] == "auto"
    pinned = build_ds_config(ZeroSpec(stage=3, hf_auto=True, micro_batch=2, world_size=2, global_batch=8))
    assert "train_batch_size" not in pinned
    assert (pinned["train_micro_batch_size_per_gpu"], pinned["gradient_accumulation_steps"]) == (2, 2)


def test_output_is_deterministic_and_sorted():
    text = dumps(build_ds_config(ZeroSpec(stage=3, hidden_size=128)))
    assert text == dumps(build_ds_config(ZeroSpec(stage=3, hidden_size=128)))
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert text.endswith("}\n")


def test_cli_writes_json_and_accelerate_yaml(tmp_path):
    out, yaml = tmp_path / "ds.json", tmp_path / "acc.yaml"
    code = main(["config", "--stage", "3", "--world-size", "2", "-o", str(out), "--accelerate-yaml", str(yaml)])
    assert code == 0
    config = json.loads(out.read_text())
    assert "train_batch_size" not in config and config["train_micro_batch_size_per_gpu"] == 1
    text = yaml.read_text()
    assert "distributed_type: DEEPSPEED" in text and f'deepspeed_config_file: "{out}"' in text
    assert "num_processes: 2" in text and "zero3_init_flag: true" in text


def test_cli_reads_hidden_size_from_model_dir(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 256}))
    assert main(["config", "--stage", "2", "--model", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["zero_optimization"]["reduce_bucket_size"] == 25 * 65536


def test_cli_tp_reads_the_heads_from_model_dir_and_validate_agrees(tmp_path, capsys):
    model = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(model))
    out = tmp_path / "ds.json"
    argv = ["config", "--stage", "1", "--tp", "4", "--world-size", "8", "--model", str(tmp_path), "-o", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text())["tensor_parallel"] == {"autotp_size": 4}
    said = capsys.readouterr().err
    assert "warning: --tp(4) exceeds the model's key-value heads(2)" in said and "fix: set --tp 2" in said
    assert main(["validate", str(out), "--world-size", "8", "--model", str(tmp_path)]) == 0
    assert "autotp_size(4) exceeds the model's key-value heads(2)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stage", "2", "--model", "/nonexistent"], "no config.json"),
        (["--stage", "2", "--tp", "3", "--world-size", "4"], "--tp(3) does not divide the world size(4"),
        (["--stage", "2", "--tp", "0"], "--tp must be a positive integer"),
        (["--stage", "1", "--offload-param", "cpu"], "--offload-param cpu: parameter offload needs ZeRO stage 3"),
        (["--stage", "1", "--micro-batch", "2", "--world-size", "4", "--global-batch", "30"], "not divisible"),
        (["--accelerate-yaml", "x.yaml"], "needs -o FILE"),
        (["--stage", "2", "--hidden-size", "0"], "--hidden-size must be a positive integer"),
    ],
)
def test_cli_errors_are_messages_not_tracebacks(argv, message, capsys):
    assert main(["config", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "fix:" in err and "Traceback" not in err


def test_bad_model_config_json_names_the_file(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    assert main(["config", "--model", str(tmp_path)]) == 2
    assert str(tmp_path / "config.json") in capsys.readouterr().err


QUICK_PATHS = {
    # `zero-kit config` needs the generator and the lint rule book, nothing of a run, and none of the linter's
    # modules that read the installed DeepSpeed (the rule book alone does not); argparse's terminal width without
    # shutil (it imports bz2 and lzma)
    ("config", "--stage", "3", "--hidden-size", "64"): (
        *("zero_kit.dist", "zero_kit.train", "zero_kit.launch", "shutil"),
        *("zero_kit.lint.schema", "zero_kit.lint.discover", "zero_kit.lint.installed", "zero_kit.lint.ds_parse"),
        *("zero_kit.lint.rules_trainer", "zero_kit.lint.script_args"),  # a user's own Trainer script's arguments
    ),
    # the top-level help lists the commands: none of their modules, and no dataclass machinery (dataclasses imports
    # inspect: 14 ms of a 35 ms Python start on this machine)
    ("--help",): (
        *("zero_kit.commands", "zero_kit.config", "zero_kit.train", "zero_kit.bench", "zero_kit.launch"),
        *("zero_kit.options", "dataclasses", "inspect"),
    ),
}


@pytest.mark.parametrize("argv", list(QUICK_PATHS), ids=" ".join)
def test_quick_commands_import_nothing_they_do_not_use(argv):
    """The quick commands' start (issue 50; benchmarks/startup `commands` has the figures): no torch, DeepSpeed or
    transformers, not the logging and socket modules the ranks' paths need, and no module of another command."""
    code = (
        "import contextlib, io, json, sys\n"
        f"sys.argv = ['zero-kit', *{list(argv)!r}]\n"
        "from zero_kit.cli import console\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    console()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True)
    loaded = json.loads(out.stdout)
    unused = ("torch", "deepspeed", "transformers", "logging", "socket", *QUICK_PATHS[argv])
    assert [m for m in loaded if m.split(".")[0] in unused or m.startswith(unused)] == []
    assert ("zero_kit.commands.config" in loaded) == (argv[0] == "config")


@pytest.mark.parametrize(
    ("spec", "flag"),
    [
        (ZeroSpec(grad_accum=-1), "--grad-accum"),
        (ZeroSpec(micro_batch=0), "--micro-batch"),
        (ZeroSpec(nodes=0, gpus_per_node=2), "--nodes"),
        (ZeroSpec(gradient_clipping=float("nan")), "--gradient-clipping"),
        (ZeroSpec(gradient_clipping=-1.0), "--gradient-clipping"),
        (ZeroSpec(lr=float("inf")), "--lr"),
        (ZeroSpec(hidden_size=-4), "--hidden-size"),
    ],
)
def test_bad_numbers_are_refused_even_without_a_world_size(spec, flag):
    with pytest.raises(UserError, match=flag):
        build_ds_config(spec)


def test_bench_zero_override_is_parsed_and_a_misspelt_key_refused():
    from zero_kit.bench.options import parse_zero_override

    assert parse_zero_override("reduce_bucket_size=4000000, overlap_comm=false") == {
        "reduce_bucket_size": 4000000,
        "overlap_comm": False,
    }
    assert parse_zero_override("") == {}
    with pytest.raises(UserError) as err:
        parse_zero_override("reduce_buckt_size=1,overlap_comm")
    said = str(err.value)
    assert "reduce_buckt_size: not a zero_optimization key" in said and "'overlap_comm': not KEY=VALUE" in said


def test_zero_kit_train_writes_the_measured_buckets_no_larger_than_what_it_trains():
    from zero_kit.train.options import TrainOptions
    from zero_kit.train.plan import trainer_ds_config

    full = trainer_ds_config(TrainOptions(stage=2), device="cpu", hidden_size=192, trainable=3_000_000)
    assert full["zero_optimization"]["reduce_bucket_size"] == 25 * 192**2
    assert full["zero_optimization"]["overlap_comm"] is False
    lora = trainer_ds_config(TrainOptions(stage=3), device="cuda", hidden_size=4096, trainable=4_000_000)
    zero = lora["zero_optimization"]
    assert zero["reduce_bucket_size"] == 4_000_000 and zero["overlap_comm"]
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 4096**2)  # it gathers frozen parameters too
    assert trainer_ds_config(TrainOptions(stage=2))["zero_optimization"]["reduce_bucket_size"] == "auto"  # API


def test_leaf_module_is_written_as_deepspeeds_own_key():
    """--leaf-module writes zero_optimization.leaf_module (ZeRO-3: one hook pair per module of the class, measured in
    benchmarks/comm_buckets), which DeepSpeed's own config model reads; nothing without the flag."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = build_ds_config(ZeroSpec(stage=3, hidden_size=64, leaf_module="LlamaDecoderLayer"))["zero_optimization"]
    assert zero["leaf_module"] == {"classes": ["LlamaDecoderLayer"]}
    assert DeepSpeedZeroConfig(**zero).leaf_module.classes == ["LlamaDecoderLayer"]
    assert "leaf_module" not in build_ds_config(ZeroSpec(stage=3, hidden_size=64))["zero_optimization"]


def test_leaf_module_below_stage_3_is_written_and_warned(capsys):
    """The generator writes what the flags say; the linter's warning names the flag (DeepSpeed marks the modules at
    every stage, only ZeRO-3 reads the mark)."""
    assert main(["config", "--stage", "2", "--hidden-size", "64", "--leaf-module", "LlamaDecoderLayer"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["zero_optimization"]["leaf_module"] == {"classes": ["LlamaDecoderLayer"]}
    assert "--leaf-module LlamaDecoderLayer: stage-3 setting has no effect at stage 2" in out.err


def test_a_cpu_config_asks_for_torchs_fused_adamw():
    """--device cpu without optimizer offload: DeepSpeed would build its FusedAdam (an op build of minutes on a small
    machine, and a step count a checkpoint does not keep bit for bit); torch's fused AdamW needs none. GPUs keep
    DeepSpeed's FusedAdam, optimizer offload its CPU Adam."""
    cpu = build_ds_config(ZeroSpec(stage=2, hidden_size=64, device="cpu"))["optimizer"]["params"]
    assert cpu["torch_adam"] is True and cpu["fused"] is True
    assert "torch_adam" not in build_ds_config(ZeroSpec(stage=2, hidden_size=64))["optimizer"]["params"]
    offload = build_ds_config(ZeroSpec(stage=2, hidden_size=64, device="cpu", offload_optimizer="cpu"))
    assert "torch_adam" not in offload["optimizer"]["params"]

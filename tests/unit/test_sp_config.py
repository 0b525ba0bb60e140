"""`zero-kit config --sp N` (issue 48): sequence_parallel_size, batch keys counted over the data-parallel ranks
(world / N) as DeepSpeed's own DeepSpeedConfig counts them, a world N does not divide refused with the fix, and with
--accelerate-yaml the parallelism settings that accelerate's own launcher reads back into a ParallelismConfig of
sp_size N and sp_backend deepspeed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zero_kit.cli import main
from zero_kit.config.builder import accelerate_yaml, generate
from zero_kit.config.spec import ZeroSpec
from zero_kit.errors import UserError
from zero_kit.lint import LintContext, lint
from zero_kit.lint.accelerate_yaml import check_accelerate_yaml, read_yaml
from zero_kit.lint.discover import deepspeed_parse


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch):
    for name in ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)


def test_sp_writes_the_key_and_counts_the_batch_over_world_over_sp():
    config = generate(ZeroSpec(stage=3, world_size=8, sp=2, micro_batch=2, global_batch=16)).config
    assert config["sequence_parallel_size"] == 2
    batch = [config[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")]
    assert batch == [16, 2, 2]  # 16 = 2 x 2 x (8 / 2)
    # DeepSpeed's own parse at 8 ranks (no mpu, as zero.Init reads it) divides the world by the key, and only so
    assert deepspeed_parse(dict(config), 8) is None
    assert "16 != 2 * 2 * 8" in deepspeed_parse({k: v for k, v in config.items() if k != "sequence_parallel_size"}, 8)
    assert not [p for p in lint(config, LintContext(world_size=8)) if p.severity == "error"]


def test_sp_1_writes_what_no_flag_writes():
    assert generate(ZeroSpec(world_size=4, sp=1)).config == generate(ZeroSpec(world_size=4)).config
    assert "sequence_parallel_size" not in generate(ZeroSpec(world_size=4)).config


def test_the_batch_flags_are_split_over_the_data_parallel_ranks_and_say_so():
    config = generate(ZeroSpec(world_size=4, sp=4, global_batch=6)).config
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"]) == (6, 6)  # one SP group
    with pytest.raises(UserError, match=r"x data-parallel size 2 \(world size 4 / --sp 2\) = 2") as err:
        generate(ZeroSpec(world_size=4, sp=2, global_batch=3))
    assert "--global-batch 2 or 4" in err.value.fix


@pytest.mark.parametrize(
    ("flags", "said", "fix"),
    [
        ({"world_size": 3, "sp": 2}, "--sp 2 does not divide the world size 3 (--world-size)", "drop --sp"),
        ({"world_size": 6, "sp": 4}, "--sp 4 does not divide the world size 6", "pass --sp 3"),
        ({"nodes": 2, "gpus_per_node": 3, "sp": 4}, "(--nodes x --gpus-per-node)", "run on a multiple of 4 ranks"),
        ({"sp": 0}, "--sp must be a positive integer, got 0", "pass --sp 1 or more"),
    ],
)
def test_a_world_sp_does_not_divide_is_refused_with_the_flag_and_the_fix(flags, said, fix):
    with pytest.raises(UserError) as err:
        generate(ZeroSpec(**flags))
    assert said in str(err.value) and fix in err.value.fix


def test_the_cli_refuses_it_and_the_model_heads_that_ulysses_refuses(tmp_path, capsys):
    assert main(["config", "--world-size", "6", "--sp", "4"]) == 2
    assert "--sp 4 does not divide the world size 6" in capsys.readouterr().err
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"hidden_size": 64, "num_attention_heads": 6, "num_key_value_heads": 3})
    )
    assert main(["config", "--world-size", "4", "--sp", "4", "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert "attention heads(6) are not divisible by sequence_parallel_size(4)" in err and "key-value heads(3)" in err
    assert (
        main(["config", "--world-size", "6", "--sp", "3", "--model", str(model), "-o", str(tmp_path / "ds.json")]) == 0
    )
    assert json.loads((tmp_path / "ds.json").read_text())["sequence_parallel_size"] == 3


def test_groups_across_nodes_are_the_linters_warning():
    (warning,) = generate(ZeroSpec(stage=3, nodes=2, gpus_per_node=3, sp=2)).warnings  # ZeRO-2: lint_sp.py
    assert "does not divide the 3 ranks per node" in warning
    assert generate(ZeroSpec(stage=3, nodes=2, gpus_per_node=4, sp=2)).warnings == ()


def _written(tmp_path: Path, *flags: str) -> Path:
    out, yaml = tmp_path / "ds.json", tmp_path / "acc.yaml"
    assert (
        main(["config", "--stage", "3", "--device", "cpu", *flags, "-o", str(out), "--accelerate-yaml", str(yaml)]) == 0
    )
    return yaml


def _as_accelerate_launches(yaml: Path, monkeypatch):
    """accelerate's own `launch_command` on the YAML, up to where it would start the DeepSpeed launcher: the
    environment it gives the ranks, and the ParallelismConfig each rank's Accelerator builds from it."""
    import accelerate.commands.launch as launch
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    started = {}
    monkeypatch.setattr(
        launch, "deepspeed_launcher", lambda args: started.update(env=prepare_deepspeed_cmd_env(args)[1])
    )
    launch.launch_command(launch.launch_command_parser().parse_args(["--config_file", str(yaml), "train.py"]))
    env = {k: v for k, v in started["env"].items() if "PARALLELISM_CONFIG" in k}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env, (ParallelismConfig() if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true" else None)


@pytest.mark.parametrize(("world", "sp"), [(2, 2), (4, 2)])
def test_accelerate_reads_sp_back_from_the_yaml(tmp_path, monkeypatch, world, sp):
    for name in ("ACCELERATE_USE_PARALLELISM_CONFIG", "PARALLELISM_CONFIG_SP_SIZE", "PARALLELISM_CONFIG_SP_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    yaml = _written(tmp_path, "--world-size", str(world), "--sp", str(sp))
    env, parallelism = _as_accelerate_launches(yaml, monkeypatch)
    assert env["PARALLELISM_CONFIG_SP_SIZE"] == str(sp) and env["PARALLELISM_CONFIG_SP_BACKEND"] == "deepspeed"
    assert (parallelism.sp_size, parallelism.sp_backend, parallelism.sp_enabled) == (sp, "deepspeed", True)
    assert parallelism.sp_handler.sp_attn_implementation == "sdpa" and parallelism.sp_handler.sp_seq_length_is_variable
    # accelerate's _prepare_deepspeed sets train_batch_size = micro x accum x data_parallel_size: world / sp
    assert parallelism.data_parallel_size == world // sp
    assert check_accelerate_yaml(read_yaml(str(yaml)), [str(tmp_path / "ds.json")]) == ([], [])


def test_without_sp_the_yaml_has_no_parallelism_config(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_PARALLELISM_CONFIG", raising=False)
    yaml = _written(tmp_path, "--world-size", "2")
    assert "parallelism_config" not in read_yaml(str(yaml))
    assert _as_accelerate_launches(yaml, monkeypatch)[1] is None
    assert accelerate_yaml("ds.json", 2) == accelerate_yaml("ds.json", 2, sp=1)


def test_sp_is_zero_kit_trains_and_a_world_it_does_not_divide_is_refused(monkeypatch):
    from accelerate.parallelism_config import ParallelismConfig

    from zero_kit.hf import training_arguments
    from zero_kit.train.rank import sequence_parallel_arguments

    for name, value in {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)  # a launcher's third of three ranks: nothing is brought up for the error
    with pytest.raises(UserError, match=r"--sp 2 does not divide the world size 3 \(the job's ranks\)"):
        training_arguments("out", stage=3, sp=2)
    with pytest.raises(UserError, match="--sp must be"):
        training_arguments("out", stage=3, sp=0)
    config = sequence_parallel_arguments(2)["parallelism_config"]  # what training_arguments passes the Trainer
    assert isinstance(config, ParallelismConfig) and (config.sp_backend, config.sp_size) == ("deepspeed", 2)
    assert config.sp_handler.sp_seq_length_is_variable and config.sp_handler.sp_attn_implementation == "sdpa"
    assert sequence_parallel_arguments(1) == {}

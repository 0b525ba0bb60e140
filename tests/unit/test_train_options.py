"""`zero-kit train` options: flags from the dataclass, re-launch argv, contradictions reported at once."""

from __future__ import annotations

import argparse

import pytest

from tests.support.jobs import held_port
from zero_kit.commands import train as train_command
from zero_kit.dist import single_process_env, slurm_to_torch_env, under_launcher
from zero_kit.errors import UserError
from zero_kit.options import dataclass_from_args, options_to_argv
from zero_kit.train.guards.inputs import check_inputs
from zero_kit.train.options import TrainOptions, check_options, default_lr, zero_spec
from zero_kit.train.parent import relaunch_command


def _parse(argv: list[str]) -> TrainOptions:
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    return dataclass_from_args(TrainOptions, parser.parse_args(argv))


def test_relaunch_argv_round_trips_every_changed_option():
    opts = _parse(["--stage", "3", "--lora-r", "8", "--pack", "--no-export", "--lr", "0.01", "--nproc", "2"])
    again = _parse(options_to_argv(opts))
    assert again == opts
    cmd = relaunch_command(opts, 2, 29650)
    assert cmd[1:4] == ["-m", "deepspeed.launcher.runner", "--num_gpus"] and "--nproc" not in cmd
    assert cmd[cmd.index("--master_port") + 1] == "29650" and "--no_local_rank" in cmd
    assert _parse(cmd[cmd.index("train") + 1 :]) == TrainOptions(**{**vars(opts), "nproc": None})


def test_launcher_local_rank_flag_is_accepted():
    assert _parse(["--local_rank=1", "--stage", "1"]).stage == 1


def test_contradictions_are_collected_into_one_error():
    opts = TrainOptions(ds_config="x.json", stage=3, micro_batch=0, lora_alpha=16)
    with pytest.raises(UserError) as err:
        check_options(opts)
    text = str(err.value)
    assert "--ds-config" in text and "--micro-batch must be >= 1" in text and "--lora-alpha" in text


def test_generator_spec_and_learning_rate_defaults():
    spec = zero_spec(TrainOptions(stage=3, offload_optimizer="cpu"))
    assert (spec.stage, spec.offload_optimizer, spec.hf_auto) == (3, "cpu", True)
    assert zero_spec(TrainOptions()).stage == 2
    assert default_lr(TrainOptions()) == 1e-3
    assert default_lr(TrainOptions(model="m", lora_r=8)) == 2e-4
    assert default_lr(TrainOptions(model="m")) == 2e-5
    assert default_lr(TrainOptions(lr=0.5)) == 0.5


def test_environment_detection():
    assert not under_launcher({})
    assert under_launcher(single_process_env(29651))
    slurm = slurm_to_torch_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"})
    assert (slurm["RANK"], slurm["WORLD_SIZE"], slurm["LOCAL_RANK"]) == ("3", "8", "1")
    assert slurm_to_torch_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "RANK": "0", "WORLD_SIZE": "2"}) == {}


@pytest.mark.parametrize(
    ("env", "refused"),
    [({}, True), ({"RANK": "1", "WORLD_SIZE": "2"}, False), ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, False)],
    ids=["this process starts the job", "a launcher's rank", "an srun task"],
)
def test_a_taken_master_port_is_refused_where_this_process_would_start_the_job(monkeypatch, env, refused):
    """Not in a rank, whose rank 0 may hold the port already; not with --hostfile (test_mistakes_inputs.py runs
    the command)."""
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with held_port() as port:
        opts = TrainOptions(nproc=2, master_port=port)
        if refused:
            with pytest.raises(UserError, match="holds it already"):
                check_inputs(opts, output=False)
        else:
            check_inputs(opts, output=False)

"""zero_kit.train.plan: a `zero-kit train` run resolved once, torch-free, by the process that starts it: sizes
from the launcher, the hostfile or --nproc, precision from the flags or a --ds-config file, batch and learning rate,
the planner's view, every refusal as a UserError naming the flag or key; and the plan's trip to the ranks."""

from __future__ import annotations

import dataclasses
import json

import pytest

from zero_kit.errors import UserError
from zero_kit.hf import deepspeed_config
from zero_kit.plan.assumptions import Assumptions
from zero_kit.train.options import TrainOptions
from zero_kit.train.plan import PLAN_ENV, Host, RunPlan, launch_sizes, plan_run

CPU = Host(on_gpu=False, bf16_supported=False)
GPU_BF16 = Host(on_gpu=True, bf16_supported=True)
GPU_FP16 = Host(on_gpu=True, bf16_supported=False)


def resolve_run(opts: TrainOptions, host: Host = CPU, environ: dict[str, str] | None = None) -> RunPlan:
    return plan_run(opts, environ or {}, host)


def _file(tmp_path, name: str = "ds.json", **changes) -> str:
    """A --ds-config file the HF Trainer accepts: the generated stage-2 dict with `changes` merged in."""
    config = {**deepspeed_config(stage=2), **changes}
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_sizes_from_the_launcher_the_hostfile_or_nproc(tmp_path):
    assert launch_sizes(TrainOptions(), {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_WORLD_SIZE": "2"}) == (4, 2, 2)
    assert launch_sizes(TrainOptions(), {"WORLD_SIZE": "4", "LOCAL_SIZE": "4"}) == (4, 4, 1)
    assert launch_sizes(TrainOptions(), {"SLURM_NTASKS": "6"}) == (6, 6, 1)  # srun without a per-node count
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=4\nb slots=4\n")
    assert launch_sizes(TrainOptions(hostfile=str(hostfile), nproc=2), {}) == (4, 2, 2)
    assert launch_sizes(TrainOptions(hostfile=str(hostfile)), {}) == (8, 4, 2)
    assert launch_sizes(TrainOptions(nproc=3), {}) == (3, 3, 1)
    assert launch_sizes(TrainOptions(nproc=3), {"WORLD_SIZE": "6"}) == (6, 6, 1)  # a launcher's world wins
    assert launch_sizes(TrainOptions(), {}) == (1, 1, 1)


def test_a_bad_launcher_world_size_is_a_user_error():
    with pytest.raises(UserError, match="WORLD_SIZE='two'"):
        resolve_run(TrainOptions(), environ={"WORLD_SIZE": "two"})


def test_the_plan_travels_to_the_ranks_whole(tmp_path):
    """What a rank of a relaunch reads back is the starting process's plan, field for field."""
    plan = resolve_run(TrainOptions(stage=3, nproc=2, output=str(tmp_path), lora_r=8), CPU)
    back = RunPlan.from_env(plan.to_env())
    assert back == plan and back.options == plan.options
    assert RunPlan.from_env({}) is None
    # a hostfile's ranks get it on DeepSpeed's pdsh command line: DeepSpeed's own export leaves it as it is
    from types import SimpleNamespace

    from deepspeed.launcher.multinode_runner import PDSHRunner

    runner = PDSHRunner(SimpleNamespace(user_script="x", user_args=[]), "")
    runner.add_export(PLAN_ENV, plan.to_env()[PLAN_ENV])
    assert runner.exports[PLAN_ENV] == plan.to_env()[PLAN_ENV]


def test_a_rank_runs_the_plan_it_was_given_not_its_environment(tmp_path, monkeypatch):
    """A relaunched rank whose own environment would resolve another run (another world, stage and --ds-config
    file) still runs its parent's plan: the rank derives none of it again."""
    from zero_kit.train import rank

    plan = resolve_run(TrainOptions(stage=3, nproc=2, output=str(tmp_path)), CPU)
    seen = {}
    monkeypatch.setattr(rank, "run_rank", lambda given, prepared, clock, led: seen.update(plan=given, led=led) or 7)
    monkeypatch.setattr(rank.rundata, "prepare", lambda opts, speak: None)
    environ = {**plan.to_env(), "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}
    assert rank.run_planned(environ) == 7
    assert seen["led"] is True and seen["plan"] == plan
    assert (seen["plan"].world_size, seen["plan"].dp_size, seen["plan"].zero_stage) == (2, 2, 3)
    assert rank.run_planned({"WORLD_SIZE": "8"}) is None  # no plan: this process starts the job itself
    assert PLAN_ENV in plan.to_env()


def test_the_run_is_frozen_and_holds_the_generated_dict():
    run = resolve_run(TrainOptions(stage=3), CPU)
    assert isinstance(run, RunPlan) and not run.from_file
    assert run.zero_stage == run.ds_config["zero_optimization"]["stage"] == 3
    # on the CPU the Adam section asks for torch's AdamW (RunAdjustments.torch_adam)
    assert run.ds_config["optimizer"]["params"]["torch_adam"] is True
    assert run.ds_config["optimizer"]["params"]["fused"] is True  # torch's fused CPU kernel, 3-4x its for-loop
    assert "torch_adam" not in resolve_run(TrainOptions(stage=3), GPU_BF16).ds_config["optimizer"]["params"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.precision = "bf16"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("choice", "machine", "expected"),
    [("auto", CPU, "fp32"), ("auto", GPU_BF16, "bf16"), ("auto", GPU_FP16, "fp16"), ("fp32", GPU_BF16, "fp32")],
)
def test_precision_from_the_flag_and_the_machine(choice, machine, expected):
    run = resolve_run(TrainOptions(precision=choice), machine)
    assert run.precision == run.planner().workload.precision == expected


@pytest.mark.parametrize("choice", ["bf16", "fp16"])
def test_half_precision_on_cpu_is_refused_naming_the_flag(choice):
    with pytest.raises(UserError) as err:
        resolve_run(TrainOptions(precision=choice), CPU)
    assert err.value.message == f"--precision {choice} needs a GPU; this host has none"
    assert "--precision fp32" in err.value.fix


def test_precision_from_a_ds_config_file(tmp_path):
    path = _file(tmp_path, fp16={"enabled": True})
    # --precision auto: the file's fp16 wins over bf16, which this GPU would pick
    run = resolve_run(TrainOptions(ds_config=path), GPU_BF16)
    assert run.precision == run.options.precision == "fp16" and run.from_file
    # "auto" in the file: the flag decides
    assert resolve_run(TrainOptions(ds_config=_file(tmp_path, "auto.json")), GPU_BF16).precision == "bf16"
    with pytest.raises(UserError) as err:
        resolve_run(TrainOptions(ds_config=path, precision="bf16"), GPU_BF16)
    assert "--precision bf16 vs fp16 in the file" in err.value.message and '"auto"' in err.value.fix


def test_a_file_enabling_bf16_on_cpu_is_refused_naming_the_file(tmp_path):
    path = _file(tmp_path, bf16={"enabled": True})
    with pytest.raises(UserError) as err:
        resolve_run(TrainOptions(ds_config=path), CPU)
    assert err.value.message == f"--ds-config {path} enables bf16, which needs a GPU; this host has none"
    assert "bf16.enabled" in err.value.fix


def test_batch_and_learning_rate_from_the_flags():
    run = resolve_run(TrainOptions(micro_batch=2, grad_accum=3), CPU)
    assert (run.micro_batch, run.grad_accum, run.learning_rate) == (2, 3, 1e-3)  # the embedded model's default
    assert resolve_run(TrainOptions(lora_r=8), CPU).learning_rate == 2e-4
    assert resolve_run(TrainOptions(lr=5e-5, lora_r=8), CPU).learning_rate == 5e-5


def test_batch_and_learning_rate_from_a_ds_config_file_resolved_once(tmp_path):
    optimizer = {"type": "AdamW", "params": {"lr": 3e-5, "weight_decay": "auto"}}
    path = _file(tmp_path, train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=2, optimizer=optimizer)
    run = resolve_run(TrainOptions(ds_config=path, grad_accum=2), CPU)
    assert (run.micro_batch, run.grad_accum, run.learning_rate) == (8, 2, 3e-5)
    # the run record keeps the options as the run used them
    assert (run.options.micro_batch, run.options.lr) == (8, 3e-5)
    with pytest.raises(UserError) as err:
        resolve_run(TrainOptions(ds_config=path, grad_accum=4, micro_batch=6), CPU)
    assert "--grad-accum 4 vs 2 in the file" in err.value.message and "--micro-batch 6 vs 8" in err.value.message


def test_world_and_planner_view():
    environ = {"WORLD_SIZE": "8", "RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    opts = TrainOptions(stage=3, offload_optimizer="cpu", offload_param="cpu", max_length=64)
    run = resolve_run(opts, CPU, environ)
    assert (run.world_size, run.dp_size, run.ranks_per_node, run.nodes, run.zero_stage) == (8, 8, 4, 2, 3)
    view = run.planner()
    assert (view.strategy, view.offload, view.ranks_per_node, view.nodes) == ("zero3", "optimizer+param", 4, 2)
    assert view.workload.seq_len == 64 and view.workload.micro_batch == 4
    assert view.assume == Assumptions()  # `zero-kit train` has no --assume: the planner's defaults
    stage2 = resolve_run(TrainOptions(stage=2, offload_optimizer="cpu"), CPU, environ).planner()
    assert (stage2.strategy, stage2.offload) == ("zero2", "optimizer")


def test_nvme_dirs_name_where_they_were_set(tmp_path):
    nvme = str(tmp_path / "nv")
    run = resolve_run(TrainOptions(stage=3, offload_param="nvme", nvme_path=nvme), CPU)
    assert run.nvme_dirs == (("--nvme-path", nvme),) and run.planner().offload == "none"
    zero = {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme}}
    from_file = resolve_run(TrainOptions(ds_config=_file(tmp_path, zero_optimization=zero)), CPU)
    assert from_file.nvme_dirs == (("zero_optimization.offload_param.nvme_path", nvme),)


def test_nvme_offload_without_a_path_is_refused_by_the_generator():
    """Preflight no longer checks a missing NVMe path: the generator refuses the flags before any I/O."""
    with pytest.raises(UserError) as err:
        resolve_run(TrainOptions(stage=3, offload_param="nvme"), CPU)
    message = err.value.message
    assert "--offload-param" in message and "NVMe" in message and "--nvme-path" in message, message
    assert "--nvme-path" in err.value.fix


def test_nvme_offload_without_a_path_in_a_file_is_refused_by_the_linter(tmp_path):
    """... and the linter (lint/rules_zero.py, an error) refuses the file, naming the key."""
    zero = {"stage": 3, "offload_param": {"device": "nvme"}}
    path = _file(tmp_path, zero_optimization=zero)
    with pytest.raises(UserError) as err:
        resolve_run(TrainOptions(ds_config=path), CPU)
    assert "--ds-config" in err.value.message and "zero_optimization.offload_param.nvme_path" in err.value.message


def test_generator_flags_beside_a_file_are_refused_before_resolving(tmp_path):
    from zero_kit.train.options import check_options

    with pytest.raises(UserError, match="--ds-config was given together with --stage"):
        check_options(TrainOptions(ds_config=_file(tmp_path), stage=3))


def test_torch_adam_keeps_a_users_foreach_or_fused_choice():
    from zero_kit.config.builder import with_torch_adam

    for choice in ({"foreach": True}, {"fused": False}):
        params = with_torch_adam({"type": "AdamW", "params": {"lr": 1e-3, **choice}})["params"]
        assert params == {"torch_adam": True, "lr": 1e-3, **choice}  # torch refuses foreach and fused together
    assert with_torch_adam({"type": "Lion", "params": {}}) == {"type": "Lion", "params": {}}


def test_the_models_shape_is_read_as_transformers_reads_it(tmp_path):
    """The plan reads config.json without transformers (its refusals come in a second); the shape is AutoConfig's."""
    from zero_kit.model import TINY_VOCAB, build_config, load_tokenizer, tiny_llama_config
    from zero_kit.plan.shapes import shape_from_hf_config
    from zero_kit.train.plan import model_shape

    assert len(load_tokenizer(None)) == TINY_VOCAB
    assert model_shape(TrainOptions()) == shape_from_hf_config(build_config(None).to_dict())
    model = tmp_path / "m"
    model.mkdir()
    full = tiny_llama_config(vocab_size=512).to_dict()
    (model / "config.json").write_text(json.dumps({k: v for k, v in full.items() if k != "num_key_value_heads"}))
    assert model_shape(TrainOptions(model=str(model))) == shape_from_hf_config(build_config(str(model)).to_dict())

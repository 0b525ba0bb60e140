"""`zero-kit bench --ds-config FILE`: a user's own DeepSpeed config as one more run beside --strategies. Every bad input
is one line naming the file and the key, with its fix, exit 2, before anything is launched or written; the config
that runs is the file's but for the batch keys and the bench's own switches (strategies.deepspeed.user_ds_config);
the report predicts its bytes from the record's own stage, without the file. The real run: tests/dist/test_bench_compare.py."""

from __future__ import annotations

import json

import pytest

from zero_kit.bench import BenchOptions
from zero_kit.bench.report import predicted_state, same_arithmetic_as_ddp
from zero_kit.bench.user_config import check_user_config, differences, record_info
from zero_kit.cli import main
from zero_kit.config.builder import ZeroSpec, build_ds_config
from zero_kit.errors import UserError
from zero_kit.lint.problem import BATCH_KEYS
from zero_kit.plan.accounting import model_state_bytes
from zero_kit.strategies import StrategyOptions, check_name, user_config_info, user_config_name
from zero_kit.strategies.deepspeed import QUIET_STEPS, user_ds_config

BENCH = BenchOptions()


def generated(**changes) -> dict:
    """What `zero-kit config --stage 2 --device cpu --lr <the bench's> ...` writes, with `changes` merged in."""
    spec = ZeroSpec(stage=2, device="cpu", precision="fp32", lr=BENCH.lr, micro_batch=7, grad_accum=3, world_size=2)
    config = build_ds_config(spec)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        elif isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def _write(tmp_path, config, name="mine.json") -> str:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


@pytest.fixture
def no_launch(monkeypatch, tmp_path):
    """Fails the test if the bench launches anything; keeps the op build directory out of the user's."""
    from zero_kit.bench import driver

    def launched(*args, **kwargs):
        raise AssertionError("launched a strategy")

    monkeypatch.setattr(driver, "_run_one", launched)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))


OFFLOAD_NVME = {"offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}
BAD = {
    "missing": (None, "cannot read it (no such file)", "give an existing"),
    "bad JSON": (
        '{"zero_optimization": {"stage": 2},\n "bf16": {"enabled": tru}}',
        ":2:22: not valid JSON",
        "validate",
    ),
    "not an object": ("[1, 2]", "a DeepSpeed config is a JSON object", "{...}"),
    "auto": (
        generated(gradient_clipping="auto", zero_optimization={"reduce_bucket_size": "auto"}),
        '"auto" at gradient_clipping, zero_optimization.reduce_bucket_size: values the HF Trainer fills',
        "without --hf-auto",
    ),  # fmt: skip
    "lint": (generated(zero_optimization={"reduce_bucket_sise": 5}), "1 error(s) for deepspeed", "reduce_bucket_size"),
    "param offload": (
        generated(zero_optimization={"stage": 3, "offload_param": {"device": "cpu"}}),
        "zero_optimization.offload_param: the bench cannot run a parameter offload",
        "remove offload_param",
    ),  # fmt: skip
    "nvme": (generated(zero_optimization={"stage": 3, **OFFLOAD_NVME}), "offload_optimizer.device nvme", '"cpu"'),
    "offload, no optimizer": (
        generated(optimizer=None, zero_optimization={"offload_optimizer": {"device": "cpu"}}),
        "offload_optimizer without an optimizer section",
        '"optimizer"',
    ),  # fmt: skip
    "tensor parallel": (generated(tensor_parallel={"autotp_size": 2}), "tensor_parallel.autotp_size 2", "zero1_tp"),
    "pipeline": (generated(pipeline={"stages": 2}), "a pipeline section", "--strategies pp"),
    "precision": (
        generated(bf16={"enabled": True}),
        "trains in bf16 (bf16.enabled) but the bench runs --precision fp32",
        "--precision bf16",
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", BAD)
def test_each_bad_file_is_one_error_naming_it_and_nothing_is_launched(case, tmp_path, capsys, no_launch):
    content, said, fix = BAD[case]
    path = str(tmp_path / "absent.json") if content is None else _write(tmp_path, content)
    out = tmp_path / "out"
    assert main(["bench", "--strategies", "ddp", "--ds-config", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    first, *rest = err.splitlines()
    assert first.startswith(f"zero-kit bench: error: --ds-config {path}") and said in err, err
    assert fix in err.split("fix:", 1)[1] and "Traceback" not in err
    if case != "lint":  # the linter's list: each error on its line, as `zero-kit validate` prints it
        assert len(rest) == 1 and rest[0].startswith("  fix: "), err
    assert not out.exists()


def test_the_name_of_a_user_config_is_no_strategy_name(tmp_path, capsys, no_launch):
    assert main(["bench", "--strategies", "ddp,ds_config", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "'ds_config' is not a strategy name" in err and "--ds-config FILE" in err
    with pytest.raises(UserError, match="--ds-config"):
        check_name("ds_config:mine")


def test_output_without_slurm_is_refused_naming_out(tmp_path, capsys, no_launch):
    """-o/--output is --slurm's script; without --slurm a run would ignore it and write its results to bench_out."""
    wanted = tmp_path / "results"
    assert main(["bench", "--strategies", "ddp", "--output", str(wanted), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"-o/--output {wanted}: that is where --slurm writes its sbatch script" in err, err
    assert f"pass --out {wanted}, or add --slurm" in err and "Traceback" not in err
    assert not wanted.exists() and not (tmp_path / "out").exists()


def test_slurm_checks_the_file_before_writing_the_script(tmp_path, capsys):
    script = tmp_path / "bench.sbatch"
    bad = _write(tmp_path, generated(fp16={"enabled": True}))
    argv = ["bench", "--slurm", "--nodes", "2", "--gpus-per-node", "2", "-o", str(script), "--out", "/shared/out"]
    assert main([*argv, "--ds-config", bad]) == 2
    assert "trains in fp16" in capsys.readouterr().err and not script.exists()


def test_the_bench_runs_the_file_but_for_the_batch_keys_and_its_own_switches():
    file = generated()
    assert file["train_batch_size"] == 42 and file["steps_per_print"] == 100
    cpu = StrategyOptions("fp32", micro_batch=2, grad_accum=2, world_size=2, device="cpu", lr=BENCH.lr)
    ran, changes = user_ds_config(file, cpu)
    assert file == generated()  # the file's dict is left as read
    assert (ran["train_micro_batch_size_per_gpu"], ran["gradient_accumulation_steps"]) == (2, 2)
    assert "train_batch_size" not in ran and ran["steps_per_print"] == QUIET_STEPS and ran["wall_clock_breakdown"]
    assert ran["optimizer"]["params"] == {**file["optimizer"]["params"], "torch_adam": True, "fused": True}
    switched = ("optimizer", "wall_clock_breakdown", "steps_per_print", *BATCH_KEYS)
    assert {k: v for k, v in ran.items() if k not in switched} == {k: v for k, v in file.items() if k not in switched}
    assert changes[:3] == ["train_micro_batch_size_per_gpu 7 -> 2 (--micro-batch: every strategy trains the same rows)",
                           "gradient_accumulation_steps 3 -> 2 (--grad-accum)",
                           "train_batch_size 42 dropped (DeepSpeed derives micro x accum x ranks)"]  # fmt: skip
    gpu, _ = user_ds_config({**file, "wall_clock_breakdown": True}, StrategyOptions("fp32", 2, 2, 2, "cuda:0", 1e-3))
    assert gpu["optimizer"] == file["optimizer"] and gpu["wall_clock_breakdown"] is False
    offloaded = generated(zero_optimization={"offload_optimizer": {"device": "cpu"}})
    assert user_ds_config(offloaded, cpu)[0]["optimizer"] == offloaded["optimizer"]  # DeepSpeed's CPU Adam
    assert "optimizer" not in user_ds_config(generated(optimizer=None), cpu)[0]  # the bench's AdamW, as a client


def test_a_good_file_passes_and_is_entered_by_its_stage(tmp_path):
    path = _write(tmp_path, generated(zero_optimization={"stage": 3}), "my config.json")
    user = check_user_config(BenchOptions(ds_config=path, micro_batch=2, grad_accum=2), 2, 2, "cpu")
    assert user.name == user_config_name(path) == "ds_config:my_config"
    assert (user.info.stage, user.info.accounting, user.info.launcher) == (3, "zero3", "deepspeed")
    assert differences(user.config, BENCH) == []


def test_where_the_file_trains_otherwise_it_is_said_and_not_called_ddps_arithmetic():
    other = generated(optimizer={"type": "AdamW", "params": {"lr": 2e-5, "weight_decay": 0.01}}, gradient_clipping=0.0,
                      scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}})  # fmt: skip
    said = differences(other, BENCH)
    assert said == ["optimizer lr 2e-05 (the bench's AdamW: 0.001)", "optimizer weight_decay 0.01 (the bench's AdamW: 0.0)",
                    "gradient_clipping 0.0 (--gradient-clipping 1.0)",
                    "scheduler 'WarmupLR': the learning rate moves (the bench's strategies keep --lr)"]  # fmt: skip
    record = {"strategy": "ds_config:mine", "precision": "fp32", "ds_config": {"stage": 2, "differs_from_bench": said}}
    assert not same_arithmetic_as_ddp(record)
    assert same_arithmetic_as_ddp({**record, "ds_config": {"stage": 2, "differs_from_bench": []}})


@pytest.mark.parametrize(("stage", "offload"), [(1, False), (2, True), (3, False), (3, True)])
def test_the_report_predicts_a_user_config_from_the_records_own_stage(stage, offload):
    entry = {"stage": stage, "offload_optimizer": offload, "offload_param": False, "config": {}}
    record = {"strategy": "ds_config:mine", "world_size": 2, "precision": "fp32", "model": {"n_params": 10_000},
              "ds_config": entry}  # fmt: skip
    assert record_info(record) == user_config_info("ds_config:mine", stage, offload_optimizer=offload)
    expected = model_state_bytes(f"zero{stage}", 10_000, 2, "fp32", offload_optimizer=offload)
    assert predicted_state(record)["paper_total"] == expected.all_bytes


def test_the_registry_benches_a_user_config_only_where_it_benches_that_offload():
    assert user_config_info("ds_config:a", 1, offload_optimizer=True).benchable
    assert not user_config_info("ds_config:a", 3, offload_optimizer=True, offload_param=True).benchable
    assert user_config_info("ds_config:a", 3, low_precision_states=True).accounting == "zero3_bf16"
    assert user_config_name("dir/a b|c.json") == "ds_config:a_b_c"

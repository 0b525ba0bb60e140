"""Each consumer of a config and its contract (issue 37): what `zero-kit config` writes for accelerate, for
deepspeed.initialize and for --device cpu, and what `zero-kit validate --for accelerate|deepspeed` reports for a
script that brings its own optimizer (or none), read from the script (--script) or said by a flag.

The scripts judged are the ones tests/dist/test_own_loops.py runs on two ranks (own_loop_accelerate.py,
own_loop_deepspeed.py), the Trainer script of test_third_party_clients.py, and variants written here with one line
changed: each report here is what those runs met, or would meet, with that line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zero_kit.cli import main
from zero_kit.lint.own_script import read_script

DIST = Path(__file__).resolve().parents[1] / "dist"
ACCELERATE_LOOP, DEEPSPEED_LOOP = DIST / "own_loop_accelerate.py", DIST / "own_loop_deepspeed.py"
TRAINER_SCRIPT = DIST / "hf_trainer_script.py"
USER = ["--world-size", "2", "--micro-batch", "2"]


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch):
    for name in ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)


def config(tmp_path: Path, *flags: str, yaml: bool = False) -> tuple[Path, dict]:
    out = tmp_path / "ds.json"
    extra = ["--accelerate-yaml", str(tmp_path / "acc.yaml")] if yaml else []
    assert main(["config", *flags, *USER, "-o", str(out), "--force", *extra]) == 0
    return out, json.loads(out.read_text())


def validate(capsys, path: Path, *flags: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["validate", str(path), "--world-size", "2", *flags])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def variant(tmp_path: Path, script: Path, old: str, new: str) -> Path:
    text = script.read_text()
    assert old in text, old
    path = tmp_path / script.name
    path.write_text(text.replace(old, new))
    return path


def test_the_accelerate_config_leaves_the_optimizer_to_the_script(tmp_path):
    for stage in ("2", "3"):
        _, written = config(tmp_path, "--stage", stage, "--device", "cpu", yaml=True)
        assert "optimizer" not in written and "scheduler" not in written
    _, kept = config(tmp_path, "--stage", "3", "--no-client-optimizer", yaml=True)
    assert kept["optimizer"]["type"] == "AdamW"
    _, plain = config(tmp_path, "--stage", "3")  # deepspeed.initialize builds the section's AdamW
    assert plain["optimizer"]["type"] == "AdamW"
    _, own = config(tmp_path, "--stage", "3", "--client-optimizer")
    assert "optimizer" not in own


def test_device_cpu_defaults_to_fp32_and_an_explicit_precision_stays(tmp_path):
    _, cpu = config(tmp_path, "--stage", "2", "--device", "cpu")
    assert cpu["bf16"]["enabled"] is False and cpu["fp16"]["enabled"] is False
    _, gpu = config(tmp_path, "--stage", "2")
    assert gpu["bf16"]["enabled"] is True
    _, asked = config(tmp_path, "--stage", "2", "--device", "cpu", "--precision", "bf16")
    assert asked["bf16"]["enabled"] is True


def test_the_scripts_are_read_for_what_they_do():
    own = read_script(str(ACCELERATE_LOOP))
    assert own.client_optimizer is True and own.process_group_backend and not own.cpu_adam
    ds = read_script(str(DEEPSPEED_LOOP))
    assert ds.client_optimizer is True and ds.cpu_adam
    assert read_script(str(TRAINER_SCRIPT)).client_optimizer is False


def test_accelerate_own_loop_on_a_config_optimizer_is_an_error(tmp_path, capsys):
    path, _ = config(tmp_path, "--stage", "3", "--device", "cpu", "--no-client-optimizer", yaml=True)
    code, said = validate(capsys, path, "--for", "accelerate", "--script", str(ACCELERATE_LOOP))
    assert code == 1 and "error: optimizer" in said and "accelerate refuses a config optimizer" in said, said
    assert "--accelerate-yaml leaves it out" in said
    # A Trainer script takes the same config.
    code, said = validate(capsys, path, "--for", "accelerate", "--script", str(TRAINER_SCRIPT))
    assert code == 0 and "optimizer" not in said.split("OK", 1)[1], said
    # Unknown script: a warning that says both cases.
    code, said = validate(capsys, path, "--for", "accelerate")
    assert code == 0 and "warning: optimizer" in said and "an HF Trainer takes it" in said, said


def test_accelerate_own_loop_with_a_config_scheduler_is_an_error(tmp_path, capsys):
    path, written = config(tmp_path, "--stage", "2", "--device", "cpu", yaml=True)
    written["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}
    path.write_text(json.dumps(written))
    code, said = validate(capsys, path, "--for", "accelerate", "--client-optimizer", "--device", "cuda")
    assert code == 1 and "error: scheduler" in said and "DummyScheduler" in said, said


def test_accelerate_own_loop_without_a_cpu_process_group_is_an_error_on_cpu(tmp_path, capsys):
    path, _ = config(tmp_path, "--stage", "2", "--device", "cpu", "--hidden-size", "192", yaml=True)
    bare = variant(tmp_path, ACCELERATE_LOOP, "Accelerator(kwargs_handlers=on_cpu)", "Accelerator()")
    code, said = validate(capsys, path, "--for", "accelerate", "--script", str(bare), "--device", "cpu")
    assert code == 1 and "process 0 of 1" in said and 'InitProcessGroupKwargs(backend="gloo")' in said, said
    code, said = validate(capsys, path, "--for", "accelerate", "--script", str(bare), "--device", "cuda")
    assert code == 0 and "process 0 of 1" not in said, said  # a GPU host picks NCCL itself
    code, said = validate(capsys, path, "--for", "accelerate", "--script", str(ACCELERATE_LOOP), "--device", "cpu")
    assert code == 0 and "0 warning(s)" in said, said


def test_deepspeed_initialize_contracts(tmp_path, capsys):
    plain, _ = config(tmp_path, "--stage", "3", "--device", "cpu")
    code, said = validate(capsys, plain, "--for", "deepspeed", "--script", str(DEEPSPEED_LOOP))
    assert code == 0 and "ignores this section" in said, said  # the script's AdamW replaces the section's
    own, _ = config(tmp_path, "--stage", "3", "--device", "cpu", "--client-optimizer")
    none = variant(tmp_path, DEEPSPEED_LOOP, "model=model, optimizer=optimizer, lr_scheduler=scheduler",
                   "model=model, model_parameters=groups")  # fmt: skip
    code, said = validate(capsys, own, "--for", "deepspeed", "--script", str(none))
    assert code == 1 and "the engine builds no optimizer" in said, said
    code, said = validate(capsys, own, "--for", "deepspeed", "--script", str(DEEPSPEED_LOOP))
    assert code == 0 and "0 warning(s)" in said, said


def test_deepspeed_offload_with_a_torch_optimizer_is_an_error_when_the_script_says_so(tmp_path, capsys):
    offload = ["--stage", "3", "--device", "cpu", "--offload-optimizer", "cpu", "--client-optimizer"]
    path, _ = config(tmp_path, *offload)
    torch_only = variant(tmp_path, DEEPSPEED_LOOP, "(DeepSpeedCPUAdam if offload else torch.optim.AdamW)(groups",
                         "torch.optim.AdamW(groups")  # fmt: skip
    torch_only.write_text(torch_only.read_text().replace("from deepspeed.ops.adam import DeepSpeedCPUAdam\n", ""))
    code, said = validate(capsys, path, "--for", "deepspeed", "--script", str(torch_only))
    assert code == 1 and "error: zero_optimization.offload_optimizer.device" in said, said
    assert "DeepSpeedCPUAdam" in said
    code, said = validate(capsys, path, "--for", "deepspeed", "--script", str(DEEPSPEED_LOOP))
    assert code == 0 and "offload_optimizer" not in said, said
    code, said = validate(capsys, path, "--for", "deepspeed", "--client-optimizer")  # not read: a warning
    assert code == 0 and "warning: zero_optimization.offload_optimizer.device" in said, said


def test_an_unreadable_script_is_named(tmp_path, capsys):
    path, _ = config(tmp_path, "--stage", "2")
    code, said = validate(capsys, path, "--for", "accelerate", "--script", str(tmp_path / "missing.py"))
    assert code == 2 and "--script" in said and "missing.py" in said and "Traceback" not in said, said
    broken = tmp_path / "broken.py"
    broken.write_text("def main(:\n")
    code, said = validate(capsys, path, "--for", "accelerate", "--script", str(broken))
    assert code == 2 and "broken.py: line 1" in said, said


def test_the_accelerate_yaml_is_checked_against_what_accelerate_reads(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, _ = config(tmp_path, "--stage", "3", "--device", "cpu", yaml=True)
    written = tmp_path / "acc.yaml"
    code, said = validate(capsys, path, "--for", "accelerate", "--accelerate-config", str(written))
    assert code == 0 and "acc.yaml: OK (0 error(s), 0 warning(s))" in said, said  # what zero-kit config writes
    text = written.read_text().replace("zero3_init_flag:", "zero3_init_flags:")
    text = text.replace("deepspeed_config:\n", "deepspeed_config:\n  zero_stage: 3\n") + "use_cpu: true\nfoo: 1\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    code, said = validate(capsys, path, "--for", "accelerate", "--accelerate-config", str(bad))
    assert code == 1 and "bad.yaml: FAILED (3 error(s), 1 warning(s))" in said, said
    assert "error: deepspeed_config.zero3_init_flags" in said and "did you mean 'zero3_init_flag'" in said
    assert "error: deepspeed_config.zero_stage" in said and "beside deepspeed_config_file" in said
    assert "error: foo" in said and "warning: use_cpu" in said
    missing = tmp_path / "missing.yaml"
    missing.write_text(written.read_text().replace(str(path), str(tmp_path / "gone.json")))
    code, said = validate(capsys, path, "--for", "accelerate", "--accelerate-config", str(missing))
    assert code == 1 and "deepspeed_config.deepspeed_config_file" in said and "no such file" in said, said
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [\n")
    code, said = validate(capsys, path, "--accelerate-config", str(broken))
    assert code == 2 and "broken.yaml: line 2 not YAML" in said and "OK" not in said, said  # read before any report


def test_accelerate_refuses_the_keys_the_yaml_check_calls_unknown(tmp_path):
    """accelerate's own loader raises on the top-level key the check calls an error (not only our reading)."""
    from accelerate.commands.config.config_args import load_config_from_file

    path = tmp_path / "acc.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nfoo: 1\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_config_from_file(str(path))

"""`zero-kit plan` through the real CLI entry: the table, --json's shape, -o writing a config, refusals."""

from __future__ import annotations

import json

import pytest

from zero_kit.cli import main


def _run(capsys, *argv):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_for_the_readme_case(capsys):
    code, out, _ = _run(capsys, "--params", "8e9", "--gpu-mem", "80GB", "--gpus-per-node", "8")
    assert code == 0
    assert "recommended: zero2" in out
    rows = {
        line[1:].split()[0]: line[1:].split()[1]
        for line in out.splitlines()
        if line[:1] in (" ", "*") and line[1:2].isalpha()
    }
    assert rows["ddp"] == "no" and rows["zero2"] == "yes" and rows["zero3"] == "yes" and rows["fsdp"] == "yes"
    assert "2Ψ + 18Ψ/N" in out and "breakdown for zero2" in out


def test_json_shape(capsys):
    code, out, _ = _run(capsys, "--model", "llama-3-8b", "--gpu-mem", "80GiB", "--gpus-per-node", "8", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["model"]["n_params"] == 8_030_261_248
    assert len(doc["options"]) == 14  # 13 data-parallel options and zero1+tp8 (tensor parallel over the node)
    assert doc["options"][-1]["label"] == "zero1+tp8" and doc["options"][-1]["layout"]["tp"] == 8
    for option in doc["options"]:
        assert {"strategy", "offload", "fits", "gpu_bytes", "host_bytes"} <= option.keys()
        parts = option["gpu_bytes"]
        assert parts["total"] == parts["model_states"] + parts["activations"] + parts["buffers"]
    assert doc["recommended"]["strategy"] in ("zero1", "zero2")
    fitting = {(o["strategy"], o["offload"]) for o in doc["options"] if o["fits"]}
    assert (doc["recommended"]["strategy"], doc["recommended"]["offload"]) in fitting


def test_output_writes_the_recommended_deepspeed_config(capsys, tmp_path):
    path = tmp_path / "ds.json"
    argv = ["--model", "llama-3-70b", "--gpu-mem", "80GB", "--gpus-per-node", "8", "--activation-checkpointing"]
    code, _, err = _run(capsys, *argv, "-o", str(path))
    assert code == 0, err
    config = json.loads(path.read_text())
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["reduce_bucket_size"] == 500_000_000  # 25 h² capped at DeepSpeed's default
    assert config["train_batch_size"] == 8 and config["bf16"]["enabled"] is True


def test_model_directory_is_read(capsys, tmp_path):
    from zero_kit.model import tiny_llama_config

    tiny_llama_config().save_pretrained(tmp_path)
    code, out, _ = _run(capsys, "--model", str(tmp_path), "--gpu-mem", "24G", "--json")
    assert code == 0
    assert json.loads(out)["model"]["shape"]["hidden_size"] == tiny_llama_config().hidden_size


def test_nothing_fits_is_refused_with_numbers(capsys):
    code, out, err = _run(capsys, "--model", "llama-3-70b", "--gpu-mem", "24GB", "--host-mem", "64GB")
    assert code == 1
    assert "refused" in out and "short by" in out and "Would fit" in out
    assert "nothing fits" in err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--params", "8e9"], "--gpu-mem is required"),
        (["--params", "8e9", "--gpu-mem", "eighty"], "is not a size"),
        (["--params", "lots", "--gpu-mem", "80GB"], "not a parameter count"),
        (["--model", "no-such-model", "--gpu-mem", "80GB"], "neither a directory"),
        (["--gpu-mem", "80GB"], "exactly one of --model and --params"),
        (["--params", "8e9", "--hidden-size", "4096", "--gpu-mem", "80GB"], "go together"),
        (["--params", "8e9", "--gpu-mem", "80GB", "--nodes", "0"], "--nodes must be at least 1"),
    ],
)
def test_user_mistakes_are_named(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_sizes_and_counts():
    from zero_kit.commands.plan import parse_count, parse_size

    assert parse_size("80GB", "--gpu-mem") == 80 * 10**9
    assert parse_size("80GiB", "--gpu-mem") == parse_size("80G", "--gpu-mem") == 80 * 2**30
    assert parse_size("1.5TB", "--host-mem") == 1_500 * 10**9
    assert parse_count("8e9") == parse_count("8B") == 8 * 10**9
    assert parse_count("350m") == 350 * 10**6


def test_json_refusal_has_no_recommendation(capsys):
    code, out, _ = _run(capsys, "--model", "llama-3-70b", "--gpu-mem", "24GB", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["recommended"] is None and not any(o["fits"] for o in doc["options"])
    assert any("short by" in reason for reason in doc["reasons"])


def test_output_for_fsdp_writes_nearest_zero_and_says_so(capsys, tmp_path, monkeypatch):
    import zero_kit.plan.recommend as plan_module

    # Force FSDP2 to rank first, to exercise the "not DeepSpeed" path of -o.
    monkeypatch.setattr(plan_module, "speed_key", lambda option, hardware: option.strategy != "fsdp")
    path = tmp_path / "ds.json"
    code, _, err = _run(capsys, "--model", "llama-3-8b", "--gpu-mem", "80GB", "--gpus-per-node", "8", "-o", str(path))
    assert code == 0
    assert "not DeepSpeed" in err and "stage 3" in err
    assert json.loads(path.read_text())["zero_optimization"]["stage"] == 3


def test_fp32_and_lora_formulas_reach_the_json(capsys):
    code, out, _ = _run(
        capsys, "--model", "llama-3.2-1b", "--gpu-mem", "80GB", "--gpus-per-node", "2", "--precision", "fp32", "--json"
    )
    assert code == 0
    formulas = {o["label"]: o["model_states_formula"] for o in json.loads(out)["options"]}
    assert formulas["zero3"] == "20Ψ/N" and formulas["zero2"] == "4Ψ + 16Ψ/N"
    code, out, _ = _run(capsys, "--model", "llama-3.2-1b", "--gpu-mem", "24GB", "--lora-r", "8", "--json")
    options = {o["label"]: o for o in json.loads(out)["options"]}
    assert options["zero2"]["model_states_formula"] == "2Ψf + 2Ψt + 18Ψt/N"
    assert options["zero2"]["gpu_bytes"]["model_states"] < 3 * 10**9  # ~2.5 GB of frozen bf16 weights + small adapters


def test_output_when_ddp_is_recommended_writes_stage_0(capsys, tmp_path):
    # The registry gives DDP's nearest ZeRO stage (0); the stage was once parsed from the name's last character.
    path = tmp_path / "ds.json"
    argv = ["--model", "llama-3.2-1b", "--gpu-mem", "24GB", "--lora-r", "8", "--precision", "fp32", "-o", str(path)]
    code, out, err = _run(capsys, *argv)
    assert code == 0 and "recommended: ddp" in out
    assert "not DeepSpeed" in err and "stage 0" in err
    assert json.loads(path.read_text())["zero_optimization"]["stage"] == 0

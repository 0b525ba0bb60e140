"""Real two-rank `zero-kit train` jobs on CPU through each launcher: torchrun (ZeRO-1), accelerate launch
(ZeRO-2, with the generator's concrete config and accelerate YAML) and deepspeed (ZeRO-3 + LoRA with decoder layers
gathered as one, then the adapter and merged exports). ZeRO-3 full fine-tuning via `--nproc 2` is in test_resume_zero3.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.support.jobs import FAST, PROBE_SITE, VENV_BIN, run, zero_kit
from tests.support.runs import assert_export_is_deepspeeds, assert_trained
from zero_kit.train.startup import STARTUP_FILE

pytestmark = pytest.mark.dist
STEPS = 3


def test_torchrun_zero1(tmp_path):
    out = tmp_path / "run"
    cmd = [str(VENV_BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", "29620", "-m", "zero_kit.cli"]
    proc = run([*cmd, "train", "--stage", "1", "--max-steps", str(STEPS), "--output", str(out), "--no-export", *FAST])
    assert f"step {STEPS}/{STEPS}" in proc.stdout and "2 rank(s), ZeRO stage 1" in proc.stdout
    losses = assert_trained(out, STEPS, world_size=2, stage=1)
    assert losses[-1] < losses[0]
    assert (out / "checkpoint-3" / "zero_kit_complete.json").is_file()
    run(zero_kit("export", str(out / "checkpoint-3"), "--out", str(tmp_path / "hf")))  # ZeRO-1's layout
    assert_export_is_deepspeeds(tmp_path / "hf", out / "checkpoint-3")


def test_accelerate_launch_zero2(tmp_path):
    cfg, acc = tmp_path / "zero2.json", tmp_path / "accelerate.yaml"
    gen = ["config", "--stage", "2", "--precision", "fp32", "--micro-batch", "2", "--grad-accum", "1", "--lr", "1e-3"]
    run(zero_kit(*gen, "--world-size", "2", "-o", str(cfg), "--accelerate-yaml", str(acc)))
    out = tmp_path / "run"
    launch = [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(acc), "--main_process_port", "29621"]
    job = ["-m", "zero_kit.cli", "train", "--ds-config", str(cfg), "--max-steps", str(STEPS), "--output", str(out)]
    # batch and lr come from the file; the user's OMP_NUM_THREADS (not what zero-kit's rule would give, and no more
    # than the cores: torch caps its pool there) reaches the ranks through accelerate untouched
    users = 2 if max(1, len(os.sched_getaffinity(0)) // 2) == 1 else 1
    proc = run([*launch, *job, "--no-export", "--max-length", "64"], extra_env={"OMP_NUM_THREADS": str(users)})
    assert "2 rank(s), ZeRO stage 2" in proc.stdout
    # docs/training.md's accelerate example printed 13,872 FutureWarnings (torch about DeepSpeed's collectives)
    assert (proc.stdout + proc.stderr).count("FutureWarning") <= 5, proc.stderr[-3000:]
    assert_trained(out, STEPS, world_size=2, stage=2)
    assert json.loads((out / STARTUP_FILE).read_text())["threads"] == {"OMP_NUM_THREADS": str(users), "torch": users}


def test_deepspeed_zero3_lora_and_exports(tmp_path):
    """The config is the generator's with each decoder layer gathered as one (--leaf-module): DeepSpeed then hangs a
    layer's backward on its input, which LoRA's frozen embeddings leave without grad unless zero-kit train asks."""
    out, cfg = tmp_path / "run", tmp_path / "zero3_layers.json"
    gen = ["config", "--stage", "3", "--hf-auto", "--device", "cpu", "--leaf-module", "LlamaDecoderLayer"]
    run(zero_kit(*gen, "-o", str(cfg)))
    launcher = [str(VENV_BIN / "deepspeed"), "--num_gpus", "2", "--master_port", "29622", "--no_local_rank"]
    job = ["--module", "zero_kit.cli", "train", "--ds-config", str(cfg), "--lora-r", "4", "--max-steps", str(STEPS)]
    probe = tmp_path / "probe.pt"
    cmd = [*launcher, *job, "--output", str(out), *FAST]
    proc = run(cmd, extra_env={"ZERO_KIT_PROBE_LOGITS": str(probe)}, site=PROBE_SITE)
    assert "LoRA r=4" in proc.stdout
    assert_trained(out, STEPS, world_size=2, stage=3)
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # each rank: the cores shared by the launcher's 2 ranks
    assert json.loads((out / STARTUP_FILE).read_text())["threads"] == {
        "OMP_NUM_THREADS": str(threads),
        "torch": threads,
    }
    assert "OMP_NUM_THREADS" not in proc.stdout + proc.stderr  # accelerate's rule and its warning stay out
    _check_adapter_and_merge(out / "final", out / f"checkpoint-{STEPS}", tmp_path / "merged", torch.load(probe))


def _check_adapter_and_merge(adapter_dir: Path, ckpt: Path, merged_dir: Path, probe: dict) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    adapter = load_file(str(adapter_dir / "adapter_model.safetensors"))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and all(t.numel() > 0 for t in adapter.values())
    assert any(t.abs().sum() > 0 for t in lora_b), "lora_B starts at zero: it must have been trained"
    base = AutoModelForCausalLM.from_pretrained(adapter_dir / "base", dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():  # base (rebuilt by the export) + adapter == the model as it was in training
        logits = with_adapter(input_ids=probe["input_ids"], attention_mask=probe["attention_mask"]).logits
    assert torch.equal(logits, probe["logits"]), (logits - probe["logits"]).abs().max()
    run(zero_kit("export", str(ckpt), "--out", str(merged_dir), "--merge"))
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    ids = torch.arange(3, 40).reshape(1, -1)
    with torch.no_grad():
        want, got = with_adapter(input_ids=ids).logits, merged(input_ids=ids).logits
    # Merging changes the order of float operations, so equal up to rounding, not bitwise.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

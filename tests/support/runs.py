"""What a `zero-kit train` output directory and log hold, read the way every tier checks them: the step log, the
run record, the checkpoint pointer, the checkpoint a relaunch resumed from, and the final weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zero_kit.checkpoints import store

RESUMING = "zero-kit train: resuming from "


def log_records(out: Path) -> list[dict]:
    """Every record of train_log.jsonl (a line cut by SIGKILL is an error here: use logged_steps mid-run)."""
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def logged_steps(out: Path) -> list[int]:
    """The steps logged so far; empty before the first. Safe while the job runs or after it was killed."""
    path = out / "train_log.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:  # a line cut by SIGKILL
            continue
    return steps


def run_info(out: Path) -> dict:
    return json.loads((out / store.RUN_INFO).read_text())


def pointer(out: Path) -> str | None:
    """The name the `latest_complete` pointer gives (None before the first complete checkpoint)."""
    path = out / store.POINTER
    return path.read_text().strip() if path.is_file() else None


def checkpoint_step(out: Path) -> int:
    """The step of the checkpoint the pointer names (what `--resume auto` takes)."""
    return store.checkpoint_step(Path(pointer(out)))


def resumed_from(text: str) -> int | None:
    """The step `zero-kit train` says it resumed from in its output `text` (a launcher may prefix each line with
    its host); None when it says it started fresh."""
    lines = [line.split(RESUMING, 1)[1] for line in text.splitlines() if RESUMING in line]
    if not lines:
        assert "zero-kit train: starting fresh" in text, text[-3000:]
        return None
    return store.checkpoint_step(Path(lines[-1].split()[0]))


def files_in(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def assert_trained(output: Path, steps: int, world_size: int, stage: int) -> list[float]:
    """The run took `steps` optimizer steps at the expected world size and stage, with finite losses."""
    records = log_records(output)
    assert [r["step"] for r in records][-1] == steps
    losses = [r["loss"] for r in records if "loss" in r]  # eval records carry eval_loss
    assert all(0 < loss < 20 for loss in losses), losses
    info = run_info(output)
    assert (info["world_size"], info["zero_stage"]) == (world_size, stage)
    return losses


def load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def assert_bitwise_equal(got_dir: Path, want_dir: Path, why: str, *, fp32: bool = True) -> None:
    """Every tensor of the safetensors in `got_dir` equals `want_dir`'s bit for bit, and there is at least one;
    with `fp32`, each is float32 (a 16-bit export could hide a difference in the master weights)."""
    got, want = load_safetensors_dir(got_dir), load_safetensors_dir(want_dir)
    assert got.keys() == want.keys() and want
    for name, tensor in want.items():
        if fp32:
            assert tensor.dtype == torch.float32, name
        assert torch.equal(got[name], tensor), f"{name} differs {why}"


def assert_export_is_deepspeeds(exported_dir: Path, checkpoint_dir: Path) -> None:
    """The export in `exported_dir` holds exactly the tensors DeepSpeed's own reader (zero_to_fp32) gets from
    `checkpoint_dir`, bit for bit, none empty."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    exported = load_safetensors_dir(exported_dir)
    reference = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir))
    assert exported.keys() == reference.keys() and exported
    for name, tensor in reference.items():
        assert exported[name].numel() > 0 and torch.equal(exported[name], tensor), name


def assert_losses_continue(out: Path, reference: Path, steps: range, rtol: float) -> None:
    """A run resumed into `out` (at another world size) logged exactly `steps`, each loss within `rtol` of the
    uninterrupted `reference` run's at that step, and its first is well below the reference's first loss (a model
    re-initialised by accident would be back near it)."""
    resumed = {r["step"]: r["loss"] for r in log_records(out) if "loss" in r}  # not the eval records
    uninterrupted = {r["step"]: r["loss"] for r in log_records(reference) if "loss" in r}
    assert sorted(resumed) == list(steps)
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], rel=rtol), (step, loss, uninterrupted[step])
    assert uninterrupted[1] - resumed[steps[0]] > 10 * rtol * uninterrupted[1]
    print(f"\nresumed losses {resumed} vs uninterrupted {uninterrupted}")


def assert_saved(out: Path, model_dir: Path) -> None:
    """The run saved every tensor of the model whole (ZeRO-3 gathers them on save: no empty partition), trained
    (every matrix moved), and transformers loads exactly those weights with no DeepSpeed config alive."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    saved, initial = load_safetensors_dir(out), load_safetensors_dir(model_dir)
    assert saved.keys() == initial.keys()
    assert not [name for name, tensor in saved.items() if tensor.numel() == 0], "empty tensors saved"
    assert all(saved[name].shape == tensor.shape for name, tensor in initial.items())
    unchanged = [n for n, t in initial.items() if t.dim() == 2 and torch.equal(saved[n], t.to(saved[n].dtype))]
    assert not unchanged, f"not trained: {unchanged}"
    assert not is_deepspeed_zero3_enabled()
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, tensor in saved.items():
        assert torch.equal(loaded[name].to(tensor.dtype), tensor), name
    assert all(torch.isfinite(tensor.float()).all() for tensor in saved.values())


def tiny_model_dir(path: Path) -> Path:
    """The embedded tiny LLaMA (seed 0) and the shipped tokenizer saved as a Hugging Face model directory: what a
    third-party script loads with from_pretrained."""
    from zero_kit.model import load_model, load_tokenizer

    load_model(None, seed=0).save_pretrained(path)
    load_tokenizer(None).save_pretrained(path)
    return path

"""`zero-kit train --method dpo` (issue 49) on two CPU ranks under the real `deepspeed` launcher, two launches shared
by the tests below: ZeRO-3 full fine-tuning (TRL's reference model prepared by DeepSpeed at ZeRO-3) and ZeRO-2 with
LoRA (no reference model: the base with the adapter off). Both train 10 steps on the first 16 pairs of the bundled
preference set, so each pair comes back and the reward margin has something to rise on (held-out pairs:
benchmarks/dpo, the margin part). A probe (tests/dist/dpo_probe) reads the reference in every rank when training
begins and ends.

Checked: exit 0; the reward margin and the loss of the last steps against step 1's (where the trained model is the
reference: margin 0, loss ln 2); the reference's weights bitwise unchanged, partitioned under ZeRO-3 (each rank holds
half) with no optimizer; per-step DPO loss of the ZeRO-3 run equal to TRL's DPOTrainer in this one process without
DeepSpeed, on the same rows in the same order (TRL tokenizing the raw rows itself), within 1e-5; the exports reload
in plain transformers and generate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support import docs
from tests.support.jobs import TESTS, run, zero_kit
from tests.support.runs import log_records

pytestmark = pytest.mark.dist

DPO_SITE = TESTS / "dist" / "dpo_probe"
PAIRS = 16
STEPS = 10
JOB = ["train", "--method", "dpo", "--nproc", "2", "--max-steps", str(STEPS), "--max-length", "64",
       "--micro-batch", "2", "--log-steps", "1"]  # fmt: skip
RUNS = {  # the embedded model's default lr for full fine-tuning (1e-3); LoRA's 2e-4 moves too little in 10 steps
    "zero3": ["--stage", "3", "--dpo-reference", "model"],
    "zero2_lora": ["--stage", "2", "--lora-r", "8", "--lr", "2e-3", "--dpo-reference", "precompute"],
}
# auto: 10 steps of 4 pairs read each of the 16 pairs at least once, so the reference is precomputed
PRECOMPUTE = ["--stage", "3"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    from zero_kit.data.preference import ASSET_PAIRS

    path = tmp_path_factory.mktemp("data") / "pairs.jsonl"
    path.write_text("".join(ASSET_PAIRS.read_text(encoding="utf-8").splitlines(keepends=True)[:PAIRS]))
    return path


def _launch(name: str, tmp_path_factory, pairs: Path, flags: list[str], cache: Path | None = None) -> dict:
    """One launch: its output, stdout and the probe's records per rank."""
    root = tmp_path_factory.mktemp(name)
    probe = root / "probe"
    probe.mkdir()
    cache = cache or root / "cache"
    argv = [*JOB, *flags, "--data", str(pairs), "--output", str(root / "out"), "--data-cache", str(cache)]
    done = run(zero_kit(*argv), timeout=420, site=DPO_SITE, extra_env={"ZERO_KIT_PROBE_DPO": str(probe)})
    ranks = [json.loads((probe / f"rank{rank}.json").read_text()) for rank in range(2)]
    return {"name": name, "out": root / "out", "stdout": done.stdout, "ranks": ranks, "cache": cache}


@pytest.fixture(scope="module")
def zero3(tmp_path_factory, pairs) -> dict:
    return _launch("zero3", tmp_path_factory, pairs, RUNS["zero3"])


@pytest.fixture(scope="module")
def zero3_precompute(tmp_path_factory, pairs) -> dict:
    return _launch("zero3_precompute", tmp_path_factory, pairs, PRECOMPUTE)


@pytest.fixture(scope="module")
def zero2_lora(tmp_path_factory, pairs, zero3_precompute) -> dict:
    """On the precompute run's data cache: the same pairs and the same starting model (LoRA's reference is the
    base), so the reference log-probabilities are read back, not computed again."""
    return _launch("zero2_lora", tmp_path_factory, pairs, RUNS["zero2_lora"], zero3_precompute["cache"])


@pytest.fixture(params=sorted(RUNS))
def trained(request) -> dict:
    """Each launch in turn (each made once for the module)."""
    return request.getfixturevalue(request.param)


def test_the_progress_line_is_the_one_the_docs_show(zero3):
    """docs/training.md's DPO progress line (block `dpo-progress`), its figures aside, is what the run prints."""
    sample = docs.covered("dpo-progress").text
    assert not docs.missing_lines(sample, zero3["stdout"], shape=True), zero3["stdout"][-3000:]


def _train_records(out: Path) -> list[dict]:
    return [record for record in log_records(out) if "loss" in record]


def test_margin_rises_and_loss_falls(trained):
    records = _train_records(trained["out"])
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    first, last = records[0], records[-3:]
    assert first["reward_margin"] == 0 and first["loss"] == pytest.approx(math.log(2), abs=1e-6)  # model = reference
    margin = sum(r["reward_margin"] for r in last) / len(last)
    loss = sum(r["loss"] for r in last) / len(last)
    assert margin > 0.1, [r["reward_margin"] for r in records]
    assert loss < math.log(2) - 0.05, [r["loss"] for r in records]
    assert all({"reward_accuracy", "reward_chosen", "reward_rejected"} <= set(r) for r in records)
    assert f"margin {records[-1]['reward_margin']:.4f}" in trained["stdout"]  # on the progress line too


def test_reference_never_changes_and_zero3_partitions_it(trained):
    for rank in trained["ranks"]:
        assert rank["steps"] == STEPS
        assert rank["begin"] == rank["end"], "the reference model's weights changed"
    total, held = trained["ranks"][0]["total"], [rank["begin"]["elements"] for rank in trained["ranks"]]
    if trained["name"] == "zero3":  # TRL's reference, prepared by DeepSpeed at ZeRO-3 with no optimizer
        assert sum(held) == total and all(count < total for count in held), (held, total)
        # DeepSpeed's ZeRO-3 parameter partitioner in the optimizer's place: no optimizer, no optimizer state
        assert all((r["ref_stage"], r["ref_optimizer"]) == (3, "DeepSpeedZeRoOffload") for r in trained["ranks"])
        assert all(r["ref_grads"] == 0 for r in trained["ranks"])
        assert all(r["begin"] == r["policy_begin"] for r in trained["ranks"]), "the reference is not the start"
        assert f"held per rank: [{held[0]:,}, {held[1]:,}]" in trained["stdout"]
    else:  # LoRA: no second model, the frozen base of the trained one (whole on each ZeRO-2 rank)
        assert all(r["ref_stage"] is None for r in trained["ranks"]) and held == [total, total]
        assert all(r["precompute"] for r in trained["ranks"])
        assert f"train: log-probabilities of {PAIRS} pairs read from the cache in " in trained["stdout"]


def test_precomputed_reference_gives_the_sharded_references_losses(zero3, zero3_precompute):
    """auto precomputes (the run reads every pair), holds no reference model, caches beside the prepared pairs,
    and trains to the same per-step losses as the run with the ZeRO-3-partitioned reference model."""
    stdout = zero3_precompute["stdout"]
    said = "DPO reference: precomputed log-probabilities (auto: the run reads every pair (2.5 times)"
    assert said in stdout, stdout[-3000:]
    assert f"train: log-probabilities of {PAIRS} pairs precomputed in " in stdout
    assert all(r["precompute"] and r["ref_stage"] is None for r in zero3_precompute["ranks"])
    # TRL's precompute engine (ZeRO-3 hooks on the trained model) is gone: the training engine's hooks alone
    assert [r["layer_hooks"] for r in zero3_precompute["ranks"]] == [r["layer_hooks"] for r in zero3["ranks"]]
    # ... and nothing else of it: its forward hooks on the root module, and the backward functions it bound to each
    # module, through which the backward fetched and released (the training trace then held the forward only)
    assert [r["root_hooks"] for r in zero3_precompute["ranks"]] == [r["root_hooks"] for r in zero3["ranks"]]
    assert [r["trace_modules"] for r in zero3_precompute["ranks"]] == [r["trace_modules"] for r in zero3["ranks"]]
    assert list(zero3_precompute["cache"].glob("*/cache-*.arrow")), "no cached log-probabilities"
    ours = [record["loss"] for record in _train_records(zero3_precompute["out"])]
    sharded = [record["loss"] for record in _train_records(zero3["out"])]
    assert len(ours) == STEPS and max(abs(a - b) for a, b in zip(ours, sharded, strict=True)) < 1e-5, (ours, sharded)


def test_export_reloads_in_plain_transformers_and_generates(trained):
    from transformers import AutoModelForCausalLM

    from zero_kit.model import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(trained["out"] / "final")  # LoRA: transformers' peft integration
    tokenizer = load_tokenizer(None)
    prompt = tokenizer("### Instruction:\nExplain ZeRO in one sentence.\n\n### Response:\n", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert generated.shape[1] > prompt["input_ids"].shape[1]


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # TRL's, of transformers
def test_zero3_loss_equals_trl_in_one_process(zero3, pairs, tmp_path):
    """TRL's DPOTrainer alone (no DeepSpeed, one process, a batch of 4 = 2 ranks x 2) on the same raw rows: the same
    rows in the same order (the Trainer's seeded sampler, split by the ranks in turn), the same per-step loss."""
    import torch
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from zero_kit.model import load_model, load_tokenizer

    options = json.loads((zero3["out"] / "zero_kit_run.json").read_text())["options"]
    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    args = DPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, max_steps=STEPS,
                     learning_rate=1e-3, lr_scheduler_type="cosine", weight_decay=options["weight_decay"],
                     max_grad_norm=options["gradient_clipping"], seed=0, data_seed=0, beta=0.1, max_length=64,
                     logging_steps=1, save_strategy="no", report_to=[], bf16=False, disable_tqdm=True,
                     **{_checkpointing(DPOConfig): False})  # fmt: skip
    torch.manual_seed(0)
    trainer = DPOTrainer(model=load_model(None, seed=0), ref_model=load_model(None, seed=0), args=args,
                         train_dataset=Dataset.from_list(rows), processing_class=load_tokenizer(None))  # fmt: skip
    trainer.train()
    alone = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    ours = [record["loss"] for record in _train_records(zero3["out"])]
    assert len(alone) == len(ours) == STEPS
    assert max(abs(a - b) for a, b in zip(alone, ours, strict=True)) < 1e-5, list(zip(alone, ours, strict=True))


def _checkpointing(arguments: type) -> str:
    """transformers 5.23 renamed gradient_checkpointing (TRL's default: on) to activation_checkpointing."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(arguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"

"""Evaluation in a real two-rank ZeRO-3 run (`--nproc 2`, the deepspeed launcher): --eval-data is evaluated every
step through the HF Trainer's evaluate() on both ranks (each holds half of every weight), its loss and perplexity
reach train_log.jsonl, the progress lines and the end report, and each checkpoint's manifest. The eval loss of the
exported weights equals a plain single-process evaluation of them (fp32). --keep-best: the checkpoint of the lowest
eval loss stays out of --save-total-limit 1 rotation and is what final/ holds. --report-to tensorboard: the event
files, read back with TensorBoard's reader, hold the same eval losses. The data and the eval data go through the data
cache (issue 23): prepared by the launching process before the launcher starts, memory-mapped by the ranks (the
plain evaluation tokenizes the eval rows itself, in memory). ~60 s on 2 CPU cores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support.jobs import FAST, run, zero_kit
from tests.support.runs import log_records
from zero_kit.checkpoints.store import MANIFEST, RUN_INFO, list_checkpoints

pytestmark = pytest.mark.dist
STEPS = 2


def _eval_rows(path: Path) -> None:
    """Four rows: one eval batch of two per rank, a single eval step."""
    rows = [
        {"instruction": f"Add {a} and {b}.", "input": "", "output": f"{a} + {b} = {a + b}."}
        for a, b in ((1, 2), (30, 4), (5, 600), (7, 8))
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def _plain_eval_loss(model_dir: Path, eval_file: Path) -> float:
    """The loss over every graded token of the four rows, one process, no Trainer: the Trainer's estimator when the
    eval set is one step of both ranks (in an eval step transformers divides by the graded tokens of all ranks)."""
    import torch
    from transformers import AutoModelForCausalLM

    from zero_kit.data.dataset import IGNORE_INDEX, collate, load_dataset_rows, tokenize_dataset
    from zero_kit.model import load_tokenizer

    tokenizer = load_tokenizer(None)
    dataset, _ = tokenize_dataset(load_dataset_rows([str(eval_file)], "alpaca"), tokenizer, "alpaca", 64)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, graded = 0.0, 0
    with torch.no_grad():
        for example in dataset:
            count = sum(label != IGNORE_INDEX for label in example["labels"][1:])  # labels shift by one
            total += model(**collate([example], tokenizer.pad_token_id)).loss.item() * count
            graded += count
    return total / graded


def test_zero3_two_ranks_eval_and_keep_best(tmp_path):
    eval_file, out = tmp_path / "eval.jsonl", tmp_path / "run"
    _eval_rows(eval_file)
    flags = ["--nproc", "2", "--stage", "3", "--max-steps", str(STEPS), "--output", str(out), *FAST,
             "--data-cache", str(tmp_path / "cache")]  # fmt: skip
    # a learning rate far too high, so that a later step is worse and the best checkpoint is not the last one
    evals = ["--eval-data", str(eval_file), "--eval-steps", "1", "--save-steps", "1", "--save-total-limit", "1"]
    tracking = ["--report-to", "tensorboard", "--run-name", "evalrun"]
    proc = run(zero_kit("train", *flags, *evals, *tracking, "--keep-best", "--lr", "0.05", "--precision", "fp32"),
               timeout=300)  # fmt: skip
    launching = proc.stdout.index("zero-kit train: launching")
    for what in ("data", "eval data"):  # prepared here, before any rank; the ranks only load (they say nothing)
        line = next(line for line in proc.stdout.splitlines() if line.startswith(f"zero-kit train: {what}: prepared"))
        assert f" into {tmp_path / 'cache'}/" in line and proc.stdout.index(line) < launching, proc.stdout
        assert proc.stdout.count(f"zero-kit train: {what}: ") == 1 + (what == "data"), proc.stdout  # + the stats
    train_entry = json.loads((out / RUN_INFO).read_text())["data_cache"]  # the run record names the entry it used
    assert "data: prepared" in proc.stdout and f" into {train_entry}\n" in proc.stdout
    records = [r for r in log_records(out) if "eval_loss" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), records
    assert all(math.isclose(r["eval_perplexity"], math.exp(r["eval_loss"])) for r in records)
    best = min(records, key=lambda r: r["eval_loss"])
    assert f"eval at step {best['step']}: eval loss {best['eval_loss']:.4f}" in proc.stdout
    assert f"best at step {best['step']}: eval loss {best['eval_loss']:.4f}" in proc.stdout
    kept = {p.name for p in list_checkpoints(out)}
    assert kept == {f"checkpoint-{best['step']}", f"checkpoint-{STEPS}"}, (kept, records)
    manifest = json.loads((out / f"checkpoint-{best['step']}" / MANIFEST).read_text())
    assert manifest["eval_loss"] == best["eval_loss"]
    assert f"exported checkpoint-{best['step']} to" in proc.stdout
    assert _plain_eval_loss(out / "final", eval_file) == pytest.approx(best["eval_loss"], rel=1e-5)
    _assert_tensorboard_has(out / "runs" / "evalrun", records)


def _assert_tensorboard_has(logdir: Path, records: list[dict]) -> None:
    """The HF Trainer's TensorBoard integration wrote the eval loss and perplexity of every evaluation and
    zero-kit's tokens/s, read back from the event files with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"eval/loss", "eval/perplexity", "train/loss", "train/tokens_per_s"} <= set(scalars), scalars
    logged = {e.step: e.value for e in events.Scalars("eval/loss")}
    assert logged == pytest.approx({r["step"]: r["eval_loss"] for r in records}, rel=1e-6)
    assert [e.step for e in events.Scalars("train/tokens_per_s")] == list(range(1, STEPS + 1))

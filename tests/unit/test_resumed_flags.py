"""A resumed run that changes its flags (issue 39): the one line names each difference from the resumed run's
record and the value used, and the new peak lr and schedule are what trains, not the checkpoint's (the HF Trainer
restores the optimizer's and the scheduler's states, whose base lr then wins over --lr). The launch:
tests/dist/test_output_claim_runs.py."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from tests.support import docs
from zero_kit.checkpoints import store
from zero_kit.train.options import TrainOptions
from zero_kit.train.resume import announce_changes, apply_resumed_schedule, change_line, changes

RECORDED = TrainOptions(max_steps=10, save_steps=5)  # the default cosine schedule, lr 1e-3 (embedded model)


def _info(opts: TrainOptions, entry: str = "/cache/abc") -> dict:
    return {"options": asdict(opts), "data_cache": entry}


def test_each_changed_flag_is_named_with_the_value_used():
    new = replace(RECORDED, max_steps=20, lr=1e-2, lr_scheduler="constant")
    found = changes(_info(RECORDED), new, "/cache/abc")
    assert found == [("--lr", 1e-3, 1e-2), ("--lr-scheduler", "cosine", "constant"), ("--max-steps", 10, 20)]
    line = change_line(Path("out/checkpoint-10"), found)
    assert "\n" not in line and "resuming out/checkpoint-10 with flags that differ from its run: " in line
    assert "--lr 0.001 -> 0.01; --lr-scheduler cosine -> constant; --max-steps 10 -> 20" in line
    assert "used from step 11 on" in line
    assert docs.covered("resume-diff").text.strip() == line  # docs/training.md's sample


def test_the_same_flags_and_the_default_lr_spelled_out_are_no_change():
    assert changes(_info(RECORDED), RECORDED, "/cache/abc") == []
    assert changes(_info(RECORDED), replace(RECORDED, lr=1e-3), "/cache/abc") == []  # the default, given
    assert changes(_info(RECORDED), replace(RECORDED, epochs=3.0), "/cache/abc") == []  # --max-steps decides


@pytest.mark.parametrize(
    ("flag", "change"),
    [
        ("--warmup-steps", {"warmup_steps": 2}),
        ("--weight-decay", {"weight_decay": 0.1}),
        ("--micro-batch", {"micro_batch": 8}),
        ("--grad-accum", {"grad_accum": 2}),
        ("--epochs", {"max_steps": None, "epochs": 2.0}),
    ],
)
def test_the_schedule_and_batch_flags_are_watched(flag, change):
    recorded = replace(RECORDED, max_steps=None) if flag == "--epochs" else RECORDED
    assert [name for name, _, _ in changes(_info(recorded), replace(recorded, **change), "/cache/abc")][-1] == flag


def test_other_data_is_named_by_its_prepared_entry():
    found = changes(_info(RECORDED), replace(RECORDED, data="new.jsonl"), "/cache/def")
    assert found == [("data", "the bundled data (--format alpaca, --max-length 256)",
                      "new.jsonl (--format alpaca, --max-length 256)")]  # fmt: skip


def test_the_line_is_said_once_and_only_when_something_differs(tmp_path, capsys):
    ckpt = tmp_path / "checkpoint-10"
    ckpt.mkdir()
    (ckpt / store.RUN_INFO).write_text(json.dumps(_info(RECORDED)))
    assert announce_changes(RECORDED, ckpt, "/cache/abc") == [] and capsys.readouterr().err == ""
    announce_changes(replace(RECORDED, lr=5e-4), ckpt, "/cache/abc")
    assert capsys.readouterr().err.count("--lr 0.001 -> 0.0005") == 1
    assert announce_changes(RECORDED, tmp_path / "checkpoint-5", None) == []  # no record: nothing to compare


def _trained(lr: float, schedule: str, steps: int, done: int):
    """An HF-style optimizer (a decayed group and one without) and its schedule, stepped `done` times."""
    from transformers import get_scheduler

    weight, bias = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    groups = [{"params": [weight], "weight_decay": 0.0}, {"params": [bias], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    scheduler = get_scheduler(schedule, optimizer, num_warmup_steps=0, num_training_steps=steps)
    for _ in range(done):
        optimizer.step()
        scheduler.step()
    return optimizer, scheduler


def _resumed(new_lr: float, schedule: str, steps: int):
    """What the Trainer does on resume: the new flags' optimizer and schedule, then the checkpoint's states."""
    old_optimizer, old_scheduler = _trained(1e-3, "cosine", 10, 10)
    optimizer, scheduler = _trained(new_lr, schedule, steps, 0)
    optimizer.load_state_dict(old_optimizer.state_dict())
    scheduler.load_state_dict(old_scheduler.state_dict())
    return optimizer, scheduler


def test_without_the_fix_the_checkpoints_peak_lr_wins_over_the_new_one():
    """The case of the issue: --lr 1e-2 --lr-scheduler constant after a 10-step cosine run at 1e-3 trained at
    1e-3 constant, a third value."""
    optimizer, scheduler = _resumed(1e-2, "constant", 20)
    optimizer.step()
    scheduler.step()  # step 11: the restored base lr on the new schedule
    assert scheduler.get_last_lr() == [pytest.approx(1e-3)] * 2


def test_the_new_peak_lr_and_schedule_train_from_the_resumed_step():
    optimizer, scheduler = _resumed(1e-2, "constant", 20)
    apply_resumed_schedule(scheduler, 1e-2, 0.1)
    assert scheduler.get_last_lr() == [pytest.approx(1e-2)] * 2
    for _ in range(10):  # steps 11-20
        optimizer.step()
        scheduler.step()
        assert [group["lr"] for group in optimizer.param_groups] == [pytest.approx(1e-2)] * 2
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]  # the Trainer's layout


def test_a_longer_cosine_goes_on_at_the_resumed_step_of_the_new_schedule():
    import math

    optimizer, scheduler = _resumed(1e-3, "cosine", 20)
    apply_resumed_schedule(scheduler, 1e-3, 0.0)
    optimizer.step()
    scheduler.step()  # step 11 of 20
    assert scheduler.get_last_lr()[0] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 11 / 20)))

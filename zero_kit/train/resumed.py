"""A resumed run that changes its flags says what changed, and trains on what it said (issue 39).

The HF Trainer resumes a DeepSpeed checkpoint with `engine.load_checkpoint(load_optimizer_states=True,
load_lr_scheduler_states=True)`: the optimizer's param groups (lr, initial_lr, weight_decay) and the scheduler's
base_lrs come back from the checkpoint, while the schedule's shape (LambdaLR's lambda: a function or a partial, whose
state_dict holds nothing) is built from the new flags. So `--max-steps 20 --lr 1e-2 --lr-scheduler constant` after a
10-step run trained at the old peak 1e-3 on the new constant schedule: a third value, with no word (transformers
5.23, DeepSpeed 0.19).

zero-kit applies the new values instead. Before any rank starts, one line names each flag that differs from the run
record of the checkpoint being resumed and the value that will be used; on the ranks, `apply_resumed_schedule`
(ResumedScheduleCallback, at the start of training, after the checkpoint is loaded) sets the peak lr and weight
decay from the flags, so the lr of step N+1 is the new schedule at step N+1 with the new peak: neither a restarted
warm-up nor the old schedule. The data and the batch shape are applied as the Trainer does: the run goes on at the
checkpoint's step, counted in batches of the new shape, of the new data.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from zero_kit.train import checkpoint
from zero_kit.train.options import TrainOptions, default_lr

WATCHED = ("lr", "lr_scheduler", "warmup_steps", "weight_decay", "max_steps", "epochs", "micro_batch", "grad_accum")
"""The flags compared with the resumed run's record (besides the data)."""


def recorded_run(ckpt: Path) -> dict | None:
    """The run record of `ckpt` (its copy, else OUTPUT's); None when neither is readable."""
    for path in (ckpt / checkpoint.RUN_INFO, ckpt.parent / checkpoint.RUN_INFO):
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and isinstance(info.get("options"), dict):
            return info
    return None


def _effective(options: dict, opts: TrainOptions) -> dict:
    """The values a run with these recorded options trained on: its lr after the default rule, and --epochs only
    where no --max-steps decided the length."""
    known = {field.name for field in dataclasses.fields(TrainOptions)}
    then = dataclasses.replace(opts, **{key: value for key, value in options.items() if key in known})
    values = {name: getattr(then, name) for name in WATCHED}
    values["lr"] = default_lr(then)
    if then.max_steps is not None:
        values["epochs"] = None
    return values


def changes(info: dict, opts: TrainOptions, data_entry: str | None) -> list[tuple[str, object, object]]:
    """(flag, recorded value, new value) for each watched flag that differs, and the data when its prepared entry
    (a key of the data's bytes and its preparation, zero_kit.data.cache) is another."""
    was, now = _effective(info["options"], opts), _effective({}, opts)
    found = [("--" + name.replace("_", "-"), was[name], now[name]) for name in WATCHED if was[name] != now[name]]
    recorded_entry = info.get("data_cache")
    if data_entry and recorded_entry and Path(recorded_entry).name != Path(data_entry).name:
        found.append(("data", _data_words(info["options"]), _data_words(dataclasses.asdict(opts))))
    return found


def _data_words(options: dict) -> str:
    given = options.get("data") or "the bundled data"
    return f"{given} (--format {options.get('format')}, --max-length {options.get('max_length')})"


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


def change_line(target: Path, found: list[tuple[str, object, object]]) -> str:
    step = checkpoint.checkpoint_step(target)
    what = "; ".join(f"{flag} {_shown(was)} -> {_shown(now)}" for flag, was, now in found)
    after = f"step {step + 1}" if step is not None else "the resumed step"
    return (
        f"zero-kit train: resuming {target} with flags that differ from its run: {what}. The new values are used "
        f"from {after} on (the lr schedule is rebuilt from them at that step)"
    )


def announce_changes(opts: TrainOptions, target: Path, data_entry: str | None) -> list[tuple[str, object, object]]:
    """The one line before any rank starts (nothing when the record is unreadable or nothing differs)."""
    info = recorded_run(target)
    found = changes(info, opts, data_entry) if info is not None else []
    if found:
        print(change_line(target, found), file=sys.stderr, flush=True)
    return found


def apply_resumed_schedule(scheduler, learning_rate: float, weight_decay: float) -> None:
    """After the checkpoint is loaded: the peak lr and weight decay of the flags, not the checkpoint's. The
    scheduler's own optimizer groups (DeepSpeed's ZeRO optimizer shares its base optimizer's). The HF Trainer's
    first group is the decayed one, its second (biases, norms) has no decay (Trainer.create_optimizer)."""
    while not hasattr(scheduler, "lr_lambdas") and hasattr(scheduler, "scheduler"):
        scheduler = scheduler.scheduler  # accelerate's wrapper (DeepSpeedSchedulerWrapper) around the LambdaLR
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:  # not one of the Trainer's LambdaLR schedules: left as loaded
        return
    groups = scheduler.optimizer.param_groups
    groups[0]["weight_decay"] = weight_decay
    scheduler.base_lrs = [learning_rate for _ in groups]
    last = [learning_rate * rule(scheduler.last_epoch) for rule in lambdas]
    for group, value in zip(groups, last, strict=True):
        group["initial_lr"] = learning_rate
        group["lr"] = value
    scheduler._last_lr = last  # what get_last_lr() (the logged lr) returns until the next step

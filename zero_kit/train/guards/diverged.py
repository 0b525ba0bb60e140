"""A run that diverged (issue 52): once the loss or the gradient norm is NaN or infinite, every later step trains
nothing, and a run that went on to the end exported the wrecked weights to final/ and exited 0. The run stops at
the first logged step that shows it, without a checkpoint of that step, says one line naming the step and the likely
cause (--lr), and exits EXIT_DIVERGED; the newest complete checkpoint from before stays the one --resume continues.
`--export-diverged` saves and exports the diverged weights anyway (to look at them); the exit code stays.

Every rank decides alike without a collective of its own: the loss the Trainer logs is gathered from every rank and
averaged (so a NaN on any rank is a NaN on all), and DeepSpeed's gradient norm is the global one. The Trainer hides a
NaN or infinite loss from its log (`logging_nan_inf_filter`: it adds the running average instead, which showed as
`loss 0.0000`), so zero-kit's TrainingArguments turn that filter off. Under fp16 a dynamic loss scale makes an
infinite gradient norm normal (DeepSpeed skips the step and lowers the scale): there only the loss counts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainerCallback

from zero_kit.checkpoints import store
from zero_kit.errors import UserError

EXIT_DIVERGED = 65
"""Exit code of a run stopped because it diverged: EX_DATAERR from sysexits.h (the run's numbers went bad); the
same command would diverge again, so a scheduler should not requeue it unchanged."""


@dataclass(frozen=True)
class Divergence:
    step: int
    what: str
    """e.g. "the loss is nan" or "the gradient norm is inf"."""
    learning_rate: float | None
    """The scheduled learning rate of that step, as logged."""


def non_finite(logs: dict, loss_scaled: bool) -> str | None:
    """What in one log entry says the run diverged, or None. loss_scaled: fp16's dynamic loss scale, under which an
    infinite gradient norm is a skipped step, not a divergence."""
    for key, name in (("loss", "the loss"), ("grad_norm", "the gradient norm")):
        value = logs.get(key)
        if key == "grad_norm" and loss_scaled:
            continue
        if isinstance(value, (int, float)) and not math.isfinite(value):
            return f"{name} is {value}"
    return None


class DivergenceCallback(TrainerCallback):
    """Stops every rank at the first logged step whose loss or gradient norm is not finite (`found`). Without
    `keep` that step is not saved or evaluated; with it (--export-diverged) it is saved, for the export."""

    def __init__(self, *, loss_scaled: bool, keep: bool):
        self.loss_scaled = loss_scaled
        self.keep = keep
        self.found: Divergence | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Called on every rank with the same gathered loss and global norm, after the step's save decision and
        # before the save itself (the Trainer logs, evaluates, then saves).
        if self.found is not None or not logs:
            return
        what = non_finite(logs, self.loss_scaled)
        if what is None:
            return
        self.found = Divergence(state.global_step, what, logs.get("learning_rate"))
        control.should_training_stop = True
        control.should_evaluate = False
        if self.keep and not control.should_save:
            store.mark_partial(Path(args.output_dir) / f"checkpoint-{state.global_step}")  # as every save is
        control.should_save = self.keep


def diverged_error(found: Divergence, lr: float, default_lr: float, output: Path, *, given: bool,
                   exported: bool) -> UserError:  # fmt: skip
    """The run's last line: the step, what went bad, the likely cause (`lr`, the run's peak learning rate; `given`:
    by --lr) and what is left to continue from."""
    scheduled = "" if found.learning_rate is None else f", learning rate {found.learning_rate:.3g} at that step"
    cause = f"--lr {lr:g}" if given else f"the default learning rate {lr:g}"
    if given and lr > default_lr:
        cause += f", {lr / default_lr:.3g}x the default {default_lr:g}"
    intact = store.newest_complete(output)
    if exported:
        left, then = "final/ holds the diverged weights (--export-diverged)", "run again with --resume never"
    else:
        left = "no checkpoint of it was saved and final/ was not exported (--export-diverged exports it anyway)"
        then = f"--resume auto continues from {intact.name}, which is intact" if intact is not None else "run again"
    return UserError(
        f"training diverged at step {found.step}: {found.what}{scheduled}; the likely cause is a learning rate too"
        f" high ({cause}); {left}",
        f"lower --lr (e.g. {min(default_lr, lr / 10):g}) or add --warmup-steps, then {then}",
        exit_code=EXIT_DIVERGED,
    )

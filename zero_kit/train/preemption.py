"""The stop on SIGINT (Ctrl-C) or SIGTERM (a scheduler's notice) inside the training: every rank finishes its step,
saves the same complete checkpoint, and stops (how the job then ends: zero_kit.train.stopping).

The ranks agree in one all-reduce per step of the stop flag and the step's trained tokens (zero_kit.dist
.any_rank_and_sum, zero_kit.train.tokens). Where it is made matters on a step the Trainer logs: an all-reduce of its
own at the step's end made every rank wait there for the slowest once more per step, 1.2% of a stage-2 step on 2 CPU
ranks measured in place, a third of what zero-kit train cost over the plain Trainer (benchmarks/train_overhead). So on
such a step it is made in the Trainer's log (`settle`, called by tokens.counting_trainer), right after the Trainer's
own loss gather, where the ranks have just met; a request it carries is acted on at the next step's end, one step
later. A step that saves or ends the training (its trainer_state.json must have the step's tokens) or that is not
logged makes the check at its end, as does a one-process job, which has no collective to save."""

from __future__ import annotations

import signal
import sys

from transformers import TrainerCallback

from zero_kit.dist import any_rank_and_sum, initialized


class PreemptionCallback(TrainerCallback):
    """SIGINT or SIGTERM -> finish the current step (or, when the request was seen in a logged step's check, the
    next one), save a complete checkpoint, stop; `signum` says which came first, and the job exits with
    stopping.exit_code(signum).

    Ranks may receive the signal at different steps, so they act only on the all-reduced flag: all of them save the
    same step. A signal that comes again (a terminal's Ctrl-C reaches a rank directly and once more through the
    supervisor; the deepspeed launcher adds a SIGTERM) is the same request: the handler only records, and the
    supervisor, not the rank, answers a second Ctrl-C by killing every process. Only a process that is the whole job
    (`alone`: one rank, no supervisor above it) takes a second Ctrl-C as "stop at once" itself. After a stop the
    handlers stay: a late signal must not cut the rank's final barrier short."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, rank: int = 0, alone: bool = False, tokens=None):
        self.rank = rank
        self.alone = alone
        self.tokens = tokens  # a zero_kit.train.tokens.TokenCount: its sum over the ranks rides in the same all-reduce
        self.signum: int | None = None
        self.stopped = False
        self._deferred = False  # this step's check waits for the Trainer's log entry
        self._asked = False  # what a deferred check found: acted on at the next step's end
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _on_signal(self, signum, frame):
        # No printing here: the handler may run while this thread is inside a print (a reentrant write raises).
        if self.alone and signum == signal.SIGINT and self.signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            raise KeyboardInterrupt  # a second Ctrl-C: the CLI reports it; the checkpoint being written stays partial
        self.signum = self.signum or signum

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopped:
            return
        self.settle(state)  # the last step's deferred check, if no log entry made it
        saving = self._asked or control.should_save or control.should_training_stop
        if control.should_log and not saving and initialized():
            self._deferred = True  # made in the Trainer's log, where the ranks meet anyway
            return
        if self._check(state) or self._asked:  # a stopping step's tokens go into its checkpoint too
            self._stop(state, control)

    def settle(self, state) -> None:
        """Make this step's deferred check: from the Trainer's log, before the entry reads the token count. Every rank
        logs the same steps, so every rank makes it at the same point."""
        if self._deferred:
            self._deferred = False
            self._asked = self._check(state)

    def _check(self, state) -> bool:
        asked, trained = any_rank_and_sum(self.requested, self.tokens.take() if self.tokens is not None else 0)
        if self.tokens is not None:
            state.num_input_tokens_seen += trained
        return asked

    def _stop(self, state, control) -> None:
        self.stopped = True
        self.signum = self.signum or signal.SIGTERM  # a peer was asked; this rank got nothing (yet)
        control.should_save = True
        control.should_training_stop = True
        if self.rank == 0:
            name = "Ctrl-C (SIGINT)" if self.signum == signal.SIGINT else "SIGTERM"
            again = "; Ctrl-C again stops at once" if self.signum == signal.SIGINT else ""
            print(f"zero-kit train: {name} received: saving a checkpoint of step {state.global_step}, then stopping"
                  f"{again}", file=sys.stderr, flush=True)  # fmt: skip

    def on_train_end(self, args, state, control, **kwargs):
        self.settle(state)
        if not self.stopped:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)

"""Trainer callbacks of `zero-kit train`: progress and JSONL log (rank 0), complete-checkpoint marking,
and a stop on SIGINT or SIGTERM (finish the step, save, stop: zero_kit.train.stopping)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

from zero_kit.dist import any_rank_and_sum, barrier
from zero_kit.errors import UserError
from zero_kit.train import checkpoint
from zero_kit.train.resumed import apply_resumed_schedule
from zero_kit.train.stopping import LOG_FILE


class ProgressCallback(TrainerCallback):
    """Rank 0: one line per logged step (step, loss, lr, tokens/s, ETA) and the same record in OUTPUT/train_log.jsonl;
    the same for each evaluation (step, eval_loss, eval_perplexity), and the eval results at the end."""

    def __init__(self, output_dir: Path, throughput):
        self.log_path = output_dir / LOG_FILE
        self.throughput = throughput
        self._start = time.perf_counter()
        self._start_step = 0
        self.evals: list[dict] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()
        self._start_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "eval_loss" in logs:
            self._log_eval(state.global_step, logs)
        if "loss" not in logs:
            return
        elapsed = time.perf_counter() - self._start
        done = state.global_step - self._start_step
        eta = elapsed / done * (state.max_steps - state.global_step) if done else None
        record = {
            "step": state.global_step,
            "max_steps": state.max_steps,
            "epoch": round(state.epoch or 0.0, 4),
            "loss": logs["loss"],
            "lr": logs.get("learning_rate"),
            "grad_norm": logs.get("grad_norm"),
            "tokens_seen": state.num_input_tokens_seen,
            "tokens_per_s": logs.get("tokens_per_s"),
            "mfu": logs.get("mfu"),
            "elapsed_s": round(elapsed, 2),
            "eta_s": None if eta is None else round(eta, 1),
        }
        self._append(record)
        print(_progress_line(record), flush=True)

    def _log_eval(self, step: int, logs: dict) -> None:
        from zero_kit.train.evaluation import perplexity

        loss = logs["eval_loss"]
        record = {"step": step, "eval_loss": loss, "eval_perplexity": logs.get("eval_perplexity", perplexity(loss))}
        self.evals.append(record)
        self._append(record)
        print(f"eval at step {step}: {_eval_words(record)}", flush=True)

    def _append(self, record: dict) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        """Rank 0 says the eval results and draws OUTPUT/loss.png from the log (also after a stop: what was trained
        so far). A picture that cannot be drawn costs the run nothing: one line says why."""
        if not state.is_world_process_zero:
            return
        if self.evals:
            best = min(self.evals, key=lambda r: r["eval_loss"])
            print(f"zero-kit train: eval at the last step {self.evals[-1]['step']}: {_eval_words(self.evals[-1])}; "
                  f"best at step {best['step']}: {_eval_words(best)}", flush=True)  # fmt: skip
        from zero_kit.train.plots import write_loss_plot

        try:
            path = write_loss_plot(self.log_path.parent)
        except Exception as err:  # matplotlib backends and fonts vary by host: the run's result is unaffected
            print(f"zero-kit train: warning: no loss plot ({type(err).__name__}: {err})", file=sys.stderr, flush=True)
            return
        if path is not None:
            print(f"zero-kit train: loss plot in {path}", flush=True)


def _progress_line(r: dict) -> str:
    width = len(str(r["max_steps"]))
    bar_len = 20
    filled = int(bar_len * r["step"] / max(r["max_steps"], 1))
    parts = [f"[{'#' * filled}{'.' * (bar_len - filled)}] step {r['step']:>{width}}/{r['max_steps']}"]
    parts.append(f"loss {r['loss']:.4f}")
    if r["lr"] is not None:
        parts.append(f"lr {r['lr']:.2e}")
    if r["tokens_per_s"] is not None:
        parts.append(f"{r['tokens_per_s']:.0f} tok/s")
    if r["mfu"] is not None:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    if r["eta_s"] is not None:
        parts.append(f"ETA {_clock(r['eta_s'])}")
    return "  ".join(parts)


def _eval_words(record: dict) -> str:
    return f"eval loss {record['eval_loss']:.4f}, perplexity {record['eval_perplexity']:.3f}"


def _clock(seconds: float) -> str:
    minutes, sec = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}" if hours else f"{minutes}:{sec:02d}"


class CompleteCheckpointCallback(TrainerCallback):
    """Before the Trainer saves `checkpoint-N`: every rank marks it as zero-kit's (in progress). After the save on
    every rank: fsync, barrier, then rank 0 writes the manifest and moves `latest_complete` (see
    zero_kit.train.checkpoint), then old complete checkpoints are rotated out. Add it after every callback that may
    ask for a save (its `on_step_end` reads the step's final save decision)."""

    def __init__(self, output_dir: Path, keep: int | None, run_info: dict, keep_best: bool = False):
        self.output_dir = output_dir
        self.keep = keep
        self.keep_best = keep_best
        self.run_info = run_info
        self._foreign: set[str] = set()
        self._eval: tuple[int, float] | None = None  # (step, eval loss) of the latest evaluation

    def on_train_begin(self, args, state, control, **kwargs):
        # Taken when training begins: after rank 0 cleared zero-kit's leftovers (job._clear_earlier, then a barrier)
        # and before any rank can save (a save follows a step, whose collectives need every rank here first), so
        # neither a deletion under way nor another rank's fresh directory, whose mark is not written yet, is taken
        # for another tool's checkpoint.
        self._foreign = {path.name for path in checkpoint.foreign(self.output_dir)}

    def on_step_end(self, args, state, control, **kwargs):
        # The Trainer saves right after the step-end callbacks (`_maybe_log_save_evaluate`) into a directory that
        # may already exist: the mark goes in first, so a save cut short is recognisably ours.
        if control.should_save:
            self._claim(state.global_step)

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_save:
            self._claim(state.global_step)

    def _claim(self, step: int) -> None:
        ckpt = self.output_dir / f"checkpoint-{step}"
        if ckpt.name in self._foreign:
            raise UserError(
                f"{ckpt} was written by another tool: zero-kit will not save into it",
                f"move it out of {self.output_dir}, or train with another --output",
            )
        checkpoint.mark_partial(ckpt)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # The Trainer evaluates before it saves in the same step: that save's manifest records this loss.
        if metrics and isinstance(metrics.get("eval_loss"), (int, float)):
            self._eval = (state.global_step, float(metrics["eval_loss"]))

    def on_save(self, args, state, control, **kwargs):
        ckpt = self.output_dir / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero:
            checkpoint.atomic_write_text(ckpt / checkpoint.RUN_INFO, json.dumps(self.run_info, indent=1) + "\n")
        checkpoint.fsync_tree(ckpt)
        barrier()
        if state.is_world_process_zero:
            evaluated = self._eval is not None and self._eval[0] == state.global_step
            eval_loss = self._eval[1] if evaluated else None
            checkpoint.write_manifest(ckpt, step=state.global_step, world_size=args.world_size, eval_loss=eval_loss)
            checkpoint.rotate(self.output_dir, self.keep, keep_best=self.keep_best)
        barrier()


class SaveAtEndCallback(TrainerCallback):
    """Always leave a checkpoint of the last step (the export and `--resume` start from it)."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_save = True


class ResumedScheduleCallback(TrainerCallback):
    """A resumed run trains at its flags' peak lr and weight decay, not the checkpoint's (zero_kit.train.resumed):
    at the start of training, after the Trainer loaded the checkpoint's optimizer and scheduler states."""

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if state.global_step > 0 and lr_scheduler is not None:
            apply_resumed_schedule(lr_scheduler, args.learning_rate, args.weight_decay)


class HeartbeatCallback(TrainerCallback):
    """Progress for the stall watchdog (zero_kit.watchdog): a beat at every step boundary, and the long phases
    named as they start. Add it last: it reads the save decision the other callbacks made for this step."""

    def __init__(self, heartbeat) -> None:
        self.heartbeat = heartbeat

    def on_train_begin(self, args, state, control, **kwargs):
        # the engine is built and a resumed checkpoint loaded: the first step (and its op loads) gets its own allowance
        self.heartbeat.beat("startup", state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        saving = control.should_save or control.should_training_stop
        self.heartbeat.beat("save" if saving else "train", state.global_step)

    def on_save(self, args, state, control, **kwargs):
        self.heartbeat.beat("train", state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.heartbeat.beat("export", state.global_step)


class PreemptionCallback(TrainerCallback):
    """SIGINT (Ctrl-C) or SIGTERM (SLURM's notice before preemption) -> finish the current step, save a complete
    checkpoint, stop; `signum` says which came first, and the job exits with stopping.exit_code(signum).

    Ranks may receive the signal at different steps, so they agree through an all-reduce of the flag at every
    step end (carrying, with `tokens`, the step's trained tokens too: zero_kit.train.tokens); all of them then save
    the same step. A signal that comes again (a terminal's Ctrl-C reaches a rank
    directly and once more through the supervisor; the deepspeed launcher adds a SIGTERM) is the same request: the
    handler only records, and the supervisor, not the rank, answers a second Ctrl-C by killing every process. Only
    a process that is the whole job (`alone`: one rank, no supervisor above it) takes a second Ctrl-C as "stop at
    once" itself. After a stop the handlers stay: a late signal must not cut the rank's final barrier short."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, rank: int = 0, alone: bool = False, tokens=None):
        self.rank = rank
        self.alone = alone
        self.tokens = tokens  # a zero_kit.train.tokens.TokenCount: its sum over the ranks rides in the same all-reduce
        self.signum: int | None = None
        self.stopped = False
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
        asked, trained = any_rank_and_sum(self.requested, self.tokens.take() if self.tokens is not None else 0)
        if self.tokens is not None:
            state.num_input_tokens_seen += trained
        if not asked:
            return
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
        if not self.stopped:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)


class StartupCallback(TrainerCallback):
    """Closes the start-up clock's last stages: the engine's when training begins (after deepspeed.initialize and
    any checkpoint load), the first step's when it ends; rank 0 then reports (zero_kit.train.startup)."""

    def __init__(self, clock, output_dir: Path, speak: bool):
        self.clock, self.output_dir, self.speak = clock, output_dir, speak

    def on_train_begin(self, args, state, control, **kwargs):
        self.clock.mark("engine")

    def on_step_end(self, args, state, control, **kwargs):
        if "first_step" not in self.clock.done():
            self.clock.mark("first_step")
            if self.speak:
                self.clock.finish(self.output_dir)


class ThroughputCallback(TrainerCallback):
    """Adds `tokens_per_s` (all ranks together, since the previous log) and, on a known GPU, `mfu` to each
    log entry. Needs the tokens counted: `TrainingArguments(include_num_input_tokens_seen=True)` in a user's own script,
    zero_kit.train.tokens in `zero-kit train`.
    MFU = tokens/s per device x FLOPs per token / device dense peak (zero_kit.metrics) at `precision` (`zero-kit
    train` passes its resolved one; in a user's own Trainer script, where the arguments are the only record,
    it is read from their bf16/fp16 flags)."""

    def __init__(self, model=None, seq_len: int | None = None, precision: str | None = None):
        self._flops_per_token = _flops_per_token(model, seq_len) if model is not None else None
        self._precision = precision
        self._last_time: float | None = None
        self._last_tokens = 0
        self.last: dict[str, float] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self._last_time = time.perf_counter()
        self._last_tokens = state.num_input_tokens_seen

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self._last_time is None:
            return
        now = time.perf_counter()
        tokens = state.num_input_tokens_seen - self._last_tokens
        if tokens > 0 and now > self._last_time:
            logs["tokens_per_s"] = round(tokens / (now - self._last_time), 1)
            value = self._mfu(args, logs["tokens_per_s"])
            if value is not None:
                logs["mfu"] = round(value, 4)
        self._last_time, self._last_tokens = now, state.num_input_tokens_seen
        self.last = dict(logs)

    def _mfu(self, args, tokens_per_s: float) -> float | None:
        import torch

        if self._flops_per_token is None or not torch.cuda.is_available():
            return None
        from zero_kit import metrics

        precision = self._precision or ("bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
        peak = metrics.peak_flops(torch.cuda.get_device_name(), precision)
        return metrics.mfu(tokens_per_s / max(args.world_size, 1), self._flops_per_token, peak)


def _flops_per_token(model, seq_len: int | None) -> float | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    from zero_kit import metrics

    # ds_numel: under ZeRO-3 a rank's parameter tensors are empty; DeepSpeed records the full size.
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    seq = seq_len or getattr(config, "max_position_embeddings", 0)
    return metrics.flops_per_token(n_params, config.num_hidden_layers, config.hidden_size, seq)


class PerplexityCallback(TrainerCallback):
    """Adds eval_perplexity to the Trainer's eval log entry. It must run before the trackers' callbacks (which the
    Trainer puts first): zero_kit.train.job moves it to the front. See zero_kit.train.evaluation."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and isinstance(logs.get("eval_loss"), (int, float)):
            from zero_kit.train.evaluation import perplexity

            logs["eval_perplexity"] = perplexity(logs["eval_loss"])


class EvalScheduleCallback(TrainerCallback):
    """Evaluate at the last step (the Trainer does only with --eval-steps) and, with `keep_best`, before every
    save. Add it after every callback that may ask for a save. A stop on a signal saves without evaluating: the
    grace period is for the save."""

    def __init__(self, keep_best: bool):
        self.keep_best = keep_best

    def on_step_end(self, args, state, control, **kwargs):
        last = state.global_step >= state.max_steps
        stopping_early = control.should_training_stop and not last
        if last or (self.keep_best and control.should_save and not stopping_early):
            control.should_evaluate = True


def before_trackers(trainer, *callbacks: TrainerCallback) -> None:
    """Move `callbacks` (in this order) to the front of the Trainer's list: it puts the --report-to integrations
    before the callbacks it is given, and what those add to a log entry must be there when a tracker reads it."""
    handler = trainer.callback_handler
    for callback in reversed(callbacks):
        handler.callbacks.remove(callback)
        handler.callbacks.insert(0, callback)

"""What a `zero-kit train` rank does around the HF Trainer's steps, as Trainer callbacks: progress and the JSONL log
(rank 0), complete-checkpoint marking, a stop on SIGINT or SIGTERM (finish the step, save, stop:
zero_kit.train.stopping), evaluation's perplexity, the stall watchdog's heartbeat, and at the end OUTPUT/loss.png
(train loss, and eval loss where the log has it, drawn from OUTPUT/train_log.jsonl by rank 0; also after a stop).

Tokens (tokens/s, MFU, `tokens_seen` in train_log.jsonl) are counted without a collective of their own. The HF
Trainer's count (`include_num_input_tokens_seen`) gathers one number across the ranks after every micro batch and
waits for it (`.item()`; on a GPU a device sync), a round trip that neither the plain Trainer (off by default) nor
the step needs (benchmarks/train_overhead). Here each rank adds up the non-padding tokens of the micro batches it
trains where they are (`CountingTrainer.training_step`), and the sum over the ranks travels in the all-reduce the
preemption check makes at every step anyway (`PreemptionCallback`, `zero_kit.dist.any_rank_and_sum`). The Trainer's
state, its log entries and the checkpoints' trainer_state.json get what the Trainer's own count gave them.
"""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path

from transformers import TrainerCallback

from zero_kit.checkpoints import store
from zero_kit.dist import any_rank_and_sum, barrier
from zero_kit.errors import UserError
from zero_kit.launch.supervisor import SAME_CTRL_C_S
from zero_kit.log import say, warn
from zero_kit.train.guards.output import LOSS_PNG
from zero_kit.train.resume import apply_resumed_schedule
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
            **{name: logs[key] for name, key in PREFERENCE_FIGURES.items() if key in logs},  # --method dpo's
        }
        self._append(record)
        say(_progress_line(record))

    def _log_eval(self, step: int, logs: dict) -> None:
        loss = logs["eval_loss"]
        record = {"step": step, "eval_loss": loss, "eval_perplexity": logs.get("eval_perplexity", perplexity(loss))}
        record |= {
            f"eval_{name}": logs[f"eval_{key}"] for name, key in PREFERENCE_FIGURES.items() if f"eval_{key}" in logs
        }
        self.evals.append(record)
        self._append(record)
        say(f"eval at step {step}: {_eval_words(record)}")

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
            say(f"zero-kit train: eval at the last step {self.evals[-1]['step']}: {_eval_words(self.evals[-1])}; "
                  f"best at step {best['step']}: {_eval_words(best)}")  # fmt: skip
        from zero_kit.train.callbacks import write_loss_plot

        try:
            path = write_loss_plot(self.log_path.parent)
        except Exception as err:  # matplotlib backends and fonts vary by host: the run's result is unaffected
            warn(f"zero-kit train: warning: no loss plot ({type(err).__name__}: {err})")
            return
        if path is not None:
            say(f"zero-kit train: loss plot in {path}")


PREFERENCE_FIGURES = {"reward_margin": "rewards/margins", "reward_accuracy": "rewards/accuracies",
                      "reward_chosen": "rewards/chosen", "reward_rejected": "rewards/rejected"}  # fmt: skip
"""train_log.jsonl's names for the figures TRL's DPOTrainer logs (means over the step's pairs on every rank)."""


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
    if "reward_margin" in r:  # --method dpo: TRL's reward figures (beta x the log-probability ratio to the reference)
        parts.append(f"margin {r['reward_margin']:.4f}  acc {r['reward_accuracy']:.2f}  chosen "
                     f"{r['reward_chosen']:.4f}  rejected {r['reward_rejected']:.4f}")  # fmt: skip
    if r["eta_s"] is not None:
        parts.append(f"ETA {_clock(r['eta_s'])}")
    return "  ".join(parts)


def _eval_words(record: dict) -> str:
    if "eval_reward_margin" in record:  # --method dpo: the held-out pairs' margin says more than exp(DPO loss)
        return (f"eval loss {record['eval_loss']:.4f}, reward margin {record['eval_reward_margin']:.4f}, "
                f"accuracy {record['eval_reward_accuracy']:.2f}")  # fmt: skip
    return f"eval loss {record['eval_loss']:.4f}, perplexity {record['eval_perplexity']:.3f}"


def _clock(seconds: float) -> str:
    minutes, sec = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}" if hours else f"{minutes}:{sec:02d}"


class CompleteCheckpointCallback(TrainerCallback):
    """Before the Trainer saves `checkpoint-N`: every rank marks it as zero-kit's (in progress). After the save on
    every rank: fsync, barrier, then rank 0 writes the manifest and moves `latest_complete` (see
    zero_kit.checkpoints.store), then old complete checkpoints are rotated out. Add it after every callback that may
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
        self._foreign = {path.name for path in store.foreign(self.output_dir)}

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
        store.mark_partial(ckpt)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # The Trainer evaluates before it saves in the same step: that save's manifest records this loss.
        if metrics and isinstance(metrics.get("eval_loss"), (int, float)):
            self._eval = (state.global_step, float(metrics["eval_loss"]))

    def on_save(self, args, state, control, **kwargs):
        ckpt = self.output_dir / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero:
            store.atomic_write_text(ckpt / store.RUN_INFO, json.dumps(self.run_info, indent=1) + "\n")
        store.fsync_tree(ckpt)
        barrier()
        if state.is_world_process_zero:
            evaluated = self._eval is not None and self._eval[0] == state.global_step
            eval_loss = self._eval[1] if evaluated else None
            store.write_manifest(ckpt, step=state.global_step, world_size=args.world_size, eval_loss=eval_loss)
            for line in store.rotate(self.output_dir, self.keep, keep_best=self.keep_best).kept_lines():
                warn(f"zero-kit train: {line}")
        barrier()


class SaveAtEndCallback(TrainerCallback):
    """Always leave a checkpoint of the last step (the export and `--resume` start from it)."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_save = True


class ResumedScheduleCallback(TrainerCallback):
    """A resumed run trains at its flags' peak lr and weight decay, not the checkpoint's (zero_kit.train.resume):
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
    step end (carrying, with `tokens`, the step's trained tokens too: zero_kit.train.callbacks); all of them then save
    the same step. A signal that comes again (a terminal's Ctrl-C reaches a rank
    directly and once more through the supervisor; the deepspeed launcher may add a SIGTERM) is the same request: the
    handler only records, and the supervisor, not the rank, answers a second Ctrl-C by killing every process. Only
    a process that is the whole job (`alone`: one rank, no supervisor above it) takes a second Ctrl-C (more than
    SAME_CTRL_C_S after the first) as "stop at once" itself. After a stop the handlers stay: a late signal must not
    cut the rank's final barrier short."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, rank: int = 0, alone: bool = False, tokens=None):
        self.rank = rank
        self.alone = alone
        self.tokens = (
            tokens  # a zero_kit.train.callbacks.TokenCount: its sum over the ranks rides in the same all-reduce
        )
        self.signum: int | None = None
        self._first_at = 0.0  # when the first signal came (time.monotonic)
        self.stopped = False
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}
        # A relaunch's launchers block SIGINT and its ranks inherit that (zero_kit.launch.supervisor): ours from now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _on_signal(self, signum, frame):
        # No printing here: the handler may run while this thread is inside a print (a reentrant write raises).
        # A Ctrl-C delivered twice within SAME_CTRL_C_S (the terminal's and a wrapper's) is one, as in the supervisor.
        again = signum == signal.SIGINT and self.signum == signal.SIGINT
        if self.alone and again and time.monotonic() - self._first_at > SAME_CTRL_C_S:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            raise KeyboardInterrupt  # a second Ctrl-C: the CLI reports it; the checkpoint being written stays partial
        if self.signum is None:
            self._first_at = time.monotonic()
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
            warn(f"zero-kit train: {name} received: saving a checkpoint of step {state.global_step}, then stopping"
                  f"{again}")  # fmt: skip

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
    zero_kit.train.callbacks in `zero-kit train`.
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
    Trainer puts first): `before_trackers` moves it to the front."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and isinstance(logs.get("eval_loss"), (int, float)):
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


class TokenCount(TrainerCallback):
    """This rank's non-padding tokens since the last `take`, as the Trainer counts them with
    `include_num_input_tokens_seen="non_padding"`: the attention mask's ones, or (packed rows, which have none) the
    input ids that are not padding."""

    def __init__(self, pad_id: int | None):
        self.pad_id = pad_id
        self.pending = 0
        self.at_start = 0
        """The run's count when this training began (a resumed run's, from its checkpoint): the session's tokens/s."""

    def add(self, inputs) -> None:
        mask = inputs.get("attention_mask")
        ids = inputs["input_ids"]
        if mask is not None:
            count = mask.sum()
        elif self.pad_id is not None:
            count = (ids != self.pad_id).sum()
        else:
            count = ids.numel()
        self.pending = self.pending + count  # a tensor stays where it is: no wait here

    def take(self):
        pending, self.pending = self.pending, 0
        return pending

    def on_train_begin(self, args, state, control, **kwargs):
        self.at_start = state.num_input_tokens_seen


def counting_trainer(tokens: TokenCount, base: type | None = None, grad_scale: float = 1.0) -> type:
    """The Trainer class of a run: each trained micro batch goes to `tokens`; each log entry gets the count and, with
    the training's start time, the session's speed, as the Trainer adds them when it counts itself. `base`: a
    Trainer subclass to count in (TRL's DPOTrainer for --method dpo), else the HF Trainer. `grad_scale`: the training
    loss's gradient takes this factor, its value none (lint.installed.ulysses_gradient_scale: --sp at ZeRO-0/1/2)."""
    from transformers import Trainer
    from transformers.trainer_utils import speed_metrics

    from zero_kit.strategies.ulysses import with_gradient_scale

    class CountingTrainer(base or Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            tokens.add(inputs)
            return super().training_step(model, inputs, *args, **kwargs)

        def compute_loss(self, model, inputs, return_outputs=False, *args, **kwargs):
            out = super().compute_loss(model, inputs, return_outputs, *args, **kwargs)
            if grad_scale == 1.0 or not model.training:
                return out
            if return_outputs:
                return (with_gradient_scale(out[0], grad_scale), *out[1:])
            return with_gradient_scale(out, grad_scale)

        def log(self, logs, start_time=None, *args, **kwargs):
            seen = self.state.num_input_tokens_seen
            logs["num_input_tokens_seen"] = seen
            if start_time is not None:
                logs.update(speed_metrics("train", start_time, num_tokens=seen - tokens.at_start))
            return super().log(logs, start_time, *args, **kwargs)

    return CountingTrainer


def loss_points(log_path: Path) -> dict[str, list[tuple[int, float]]]:
    """{"train": [(step, loss)], "eval": [(step, eval_loss)], "margin": [(step, reward_margin)]}, by step; the margin
    is a DPO run's (--method dpo), empty otherwise. A resumed run appends to the same log and may log a step again:
    the last record of a step wins. A line cut short by a kill is skipped."""
    series: dict[str, dict[int, float]] = {"train": {}, "eval": {}, "margin": {}}
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            continue
        for name, key in (("train", "loss"), ("eval", "eval_loss"), ("margin", "reward_margin")):
            if isinstance(record.get(key), (int, float)):
                series[name][record["step"]] = float(record[key])
    return {name: sorted(points.items()) for name, points in series.items()}


def write_loss_plot(output: Path) -> Path | None:
    """OUTPUT/loss.png from the run's log; None when the log holds no loss yet."""
    points = loss_points(output / LOG_FILE)
    if not points["train"] and not points["eval"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, style in (("train", "-"), ("eval", "o-")):
        if points[name]:
            steps, losses = zip(*points[name], strict=True)
            ax.plot(steps, losses, style, label=f"{name} loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(f"{output.name}: loss over steps")
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()
    if points["margin"]:  # DPO: the reward margin (chosen - rejected) on its own axis, since it rises as loss falls
        steps, margins = zip(*points["margin"], strict=True)
        right = ax.twinx()
        right.plot(steps, margins, "--", color="tab:green", label="reward margin")
        right.set_ylabel("reward margin")
        handles = tuple(a + b for a, b in zip(handles, right.get_legend_handles_labels(), strict=True))
    ax.legend(*handles)
    fig.tight_layout()
    path = output / LOSS_PNG
    partial = path.with_name(f".{LOSS_PNG}.partial")
    fig.savefig(partial, format="png", dpi=100)
    plt.close(fig)
    partial.replace(path)  # a reader never sees half a picture
    return path


def perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf

"""Which checkpoint a `zero-kit train` run continues from, and whether the run fits it: decided in the command's own
process before any rank starts, any op is built or anything is deleted.

A checkpoint's run record (`checkpoint-N/zero_kit_run.json`, a copy of `OUTPUT/zero_kit_run.json`) says which stage,
world size, model, tuning and precision wrote it. A new world size goes through DeepSpeed's universal checkpoint
(zero_kit.checkpoints.universal). A new ZeRO stage does not: DeepSpeed names a ZeRO-3 engine's model states per
data-parallel rank (`zero_pp_rank_R_mp_rank_00_model_states.pt`, engine `_get_ckpt_name`) and a ZeRO-1/2 engine's
once (`mp_rank_00_model_states.pt`), and its universal loader looks for its own stage's names; zero-kit has no test
of a 1 <-> 2 switch either. So a stage change, like another model, LoRA vs full (or another rank) and another
precision, is one error naming both runs and the three ways on.

A resumed run that changes its flags says what changed, and trains on what it said (issue 39).

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
import os
from dataclasses import dataclass
from pathlib import Path

from zero_kit.checkpoints import store
from zero_kit.errors import UserError
from zero_kit.log import say, warn
from zero_kit.train.options import TrainOptions, default_lr

EMBEDDED_MODEL = "the embedded tiny LLaMA"


@dataclass(frozen=True)
class RunShape:
    """What a checkpoint is tied to; None: not known (an older record, or decided only on the ranks)."""

    stage: int | None
    world_size: int | None
    model: str
    lora_r: int | None
    precision: str | None
    method: str = "sft"
    """sft or dpo (--method): a DPO run does not continue an SFT run's checkpoint, nor the reverse."""

    def describe(self) -> str:
        tuning = f"LoRA r={self.lora_r}" if self.lora_r is not None else "full fine-tuning"
        tuning += ", DPO" if self.method == "dpo" else ""
        parts = [f"ZeRO-{self.stage}" if self.stage is not None else "ZeRO stage ?"]
        parts.append(f"{self.world_size} rank(s)" if self.world_size else "? ranks")
        parts += [tuning, f"model {self.model}", self.precision or "precision auto"]
        return ", ".join(parts)


RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"
"""Set by Slurm in a job it requeued (node failure, preemption with PreemptMode=REQUEUE, `scontrol requeue`,
RequeueExit): how many times it started the job's script again, from its top, with the same arguments."""
JOB_ID_KEY = "slurm_job_id"
"""The run record's key for the Slurm job that wrote it (None outside Slurm)."""


def slurm_restart(environ: dict[str, str]) -> tuple[int, str] | None:
    """(restart count, job id) in a job Slurm requeued and runs again; None in a first run or outside Slurm."""
    count, job_id = environ.get(RESTART_COUNT_ENV, ""), environ.get("SLURM_JOB_ID", "")
    return (int(count), job_id) if count.isdigit() and int(count) > 0 and job_id else None


def continue_requeued_job(opts: TrainOptions, environ: dict[str, str], speak: bool) -> TrainOptions:
    """A requeued job continues from the newest complete checkpoint it wrote itself (its run record names the job),
    whatever --resume says: `never` would delete that checkpoint and start over, a CHECKPOINT_DIR would go back to
    where the job's first run began. Before the job wrote one, --resume acts as given, as in the first run. speak:
    print the line that says so (once per job start)."""
    restart = slurm_restart(environ)
    if restart is None:
        return opts
    count, job_id = restart
    newest = store.newest_complete(Path(opts.output))
    own = newest if newest is not None and _recorded_job(newest) == job_id else None
    if speak:
        what = f"continuing from {own}, its newest complete checkpoint" if own else f"--resume {opts.resume} as given"
        warn(f"zero-kit train: requeued by Slurm: restart {count} of job {job_id}; {what}")
    return opts if own is None or opts.resume == "auto" else dataclasses.replace(opts, resume=str(own))


def _recorded_job(ckpt: Path) -> str | None:
    try:
        return json.loads((ckpt / store.RUN_INFO).read_text(encoding="utf-8")).get(JOB_ID_KEY)
    except (OSError, ValueError, AttributeError):
        return None


def check_resume(plan, speak: bool) -> None:
    """The starting process's first seconds after the plan (a `RunPlan`): name another tool's `checkpoint-N` once
    (where `speak`), and refuse a run that cannot continue the checkpoint it would take (plan.resume_from)."""
    output = plan.output
    others = store.foreign(output)
    if others and speak:
        names = ", ".join(path.name for path in others)
        warn(f"zero-kit train: warning: {names} in {output} was not written by zero-kit (no {store.MANIFEST}): left as it is, never "
             "resumed or deleted")  # fmt: skip
    if plan.resume_from is not None:
        target = Path(plan.resume_from)
        saved = recorded_shape(target)
        if saved is not None:
            check_fits(plan.options, saved, planned_shape(plan), target)


def already_done(plan, speak: bool) -> bool:
    """The checkpoint the run continues already reached --max-steps (the same command run twice, or its
    zero_kit_run.yaml repeated): the Trainer would train one step past it and replace final/. Nothing is trained;
    final/ is left as it is, or, when the export of that checkpoint was cut short (a Ctrl-C during it), written
    now. The process that speaks says so in one line and does that export."""
    from zero_kit.train.guards.output import FINAL_DIR

    steps = plan.options.max_steps
    ckpt = Path(plan.resume_from) if plan.resume_from else None
    step = store.checkpoint_step(ckpt) if ckpt is not None else None
    if steps is None or step is None or step < steps:
        return False
    final = plan.output / FINAL_DIR
    if not speak:
        return True
    if plan.options.export and not _exported(ckpt, final):
        from zero_kit.export import export_checkpoint

        say(f"zero-kit train: {ckpt} already reached --max-steps {steps}: nothing to train; its export to {final} "
            "was not finished, exporting it now")  # fmt: skip
        export_checkpoint(ckpt, final, force=plan.options.overwrite_output,
                          trust_remote_code=plan.options.trust_remote_code)  # fmt: skip
        say(f"zero-kit train: exported {ckpt.name} to {final}")
        return True
    say(f"zero-kit train: {ckpt} already reached --max-steps {steps}: nothing to train, {final} left as it is "
        "(raise --max-steps to train on, or --resume never to start over)")  # fmt: skip
    return True


def _exported(ckpt: Path, final: Path) -> bool:
    """final/ holds an export finished after `ckpt` was complete: the export writes the tokenizer last."""
    from zero_kit.export.checks import EXPORT_MARK

    try:
        return (final / EXPORT_MARK).is_file() and (
            (final / "tokenizer_config.json").stat().st_mtime >= (ckpt / store.MANIFEST).stat().st_mtime
        )
    except OSError:
        return False


def resume_target(opts: TrainOptions) -> Path | None:
    """auto: the newest complete zero-kit checkpoint in --output (None: start fresh); never: None; else the given
    directory, which must be a complete zero-kit checkpoint. Reads only: nothing is deleted here."""
    if opts.resume == "never":
        return None
    if opts.resume == "auto":
        newest = store.newest_complete(Path(opts.output))
        _refuse_damaged_newer(Path(opts.output), newest)
        return newest
    found = Path(opts.resume)
    if not store.is_complete(found):
        raise UserError(
            f"--resume {found}: not a complete zero-kit checkpoint (no {store.MANIFEST} or files missing)",
            "give a checkpoint-N directory written by zero-kit train, or use --resume auto",
        )
    return found


def _refuse_damaged_newer(output: Path, newest: Path | None) -> None:
    """A checkpoint newer than the newest sound one whose save completed but whose files are no longer all there
    (a disk fault, a hand-made deletion): never resumed, never deleted; the user decides (store.damage)."""
    after = store.checkpoint_step(newest) if newest is not None else -1
    damaged = [(path, what) for path, what in store.damaged(output) if store.checkpoint_step(path) > after]
    if not damaged:
        return
    path, what = damaged[-1]
    sound = f"--resume {newest} (the newest sound checkpoint)" if newest is not None else "--resume never"
    raise UserError(
        f"--resume auto: {path} is damaged ({what}); it was not resumed and nothing was deleted",
        f"restore the file, or continue with {sound}; move {path.name} out of {output} to go on with --resume auto",
    )


def recorded_shape(ckpt: Path) -> RunShape | None:
    """The run that wrote `ckpt`, from its copy of the run record (else OUTPUT's); None when neither is readable."""
    for path in (ckpt / store.RUN_INFO, ckpt.parent / store.RUN_INFO):
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            options = info["options"]
            return RunShape(
                stage=info.get("zero_stage"),
                world_size=info.get("world_size"),
                model=options.get("model") or EMBEDDED_MODEL,
                lora_r=options.get("lora_r"),
                precision=info.get("precision") or _explicit(options.get("precision")),
                method=options.get("method") or "sft",  # records before --method: SFT
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def planned_shape(plan) -> RunShape:
    """The new run as its plan says: stage, world size, model, tuning and precision."""
    options = plan.options
    return RunShape(
        stage=plan.zero_stage,
        world_size=plan.world_size,
        model=options.model or EMBEDDED_MODEL,
        lora_r=options.lora_r,
        precision=plan.precision,
        method=options.method,
    )


def _explicit(precision: object) -> str | None:
    return precision if isinstance(precision, str) and precision != "auto" else None


def check_fits(opts: TrainOptions, saved: RunShape, new: RunShape, target: Path) -> None:
    """One error naming both runs and the three ways on, when `new` cannot continue `saved`'s checkpoint."""
    differs = [name for name in ("stage", "model", "lora_r", "precision", "method") if _differ(saved, new, name)]
    if not differs:
        return
    what = {"stage": "ZeRO stage", "model": "model", "lora_r": "LoRA vs full (or LoRA rank)", "precision": "precision",
            "method": "method (sft vs dpo)"}  # fmt: skip
    flag = "--resume auto" if opts.resume == "auto" else f"--resume {opts.resume}"
    raise UserError(
        f"{flag}: {target} was written by another kind of run ({saved.describe()}); this run is "
        f"{new.describe()}: a checkpoint does not carry over another {', '.join(what[name] for name in differs)}",
        f"start fresh with --resume never (zero-kit's earlier checkpoints in {opts.output} are deleted once this "
        f"run's inputs pass), train into another --output, or rerun with {_matching_flags(saved, differs)}",
    )


def _differ(saved: RunShape, new: RunShape, name: str) -> bool:
    old, now = getattr(saved, name), getattr(new, name)
    if name == "lora_r":
        return old != now
    if name == "model":
        return old != now and os.path.abspath(old) != os.path.abspath(now)
    return old is not None and now is not None and old != now


def _matching_flags(saved: RunShape, differs: list[str]) -> str:
    flags = []
    if "stage" in differs:
        flags.append(f"--stage {saved.stage}")
    if "model" in differs:
        flags.append("no --model" if saved.model == EMBEDDED_MODEL else f"--model {saved.model}")
    if "lora_r" in differs:
        flags.append("no --lora-r" if saved.lora_r is None else f"--lora-r {saved.lora_r}")
    if "precision" in differs:
        flags.append(f"--precision {saved.precision}")
    if "method" in differs:
        flags.append(f"--method {saved.method}")
    return "the checkpoint's flags: " + " ".join(flags)


WATCHED = ("lr", "lr_scheduler", "warmup_steps", "weight_decay", "max_steps", "epochs", "micro_batch", "grad_accum")
"""The flags compared with the resumed run's record (besides the data)."""


def recorded_run(ckpt: Path) -> dict | None:
    """The run record of `ckpt` (its copy, else OUTPUT's); None when neither is readable."""
    for path in (ckpt / store.RUN_INFO, ckpt.parent / store.RUN_INFO):
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
    step = store.checkpoint_step(target)
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
        warn(change_line(target, found))
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

"""Which checkpoint a `zero-kit train` run continues from, and whether the run fits it: decided in the command's own
process before any rank starts, any op is built or anything is deleted.

A checkpoint's run record (`checkpoint-N/zero_kit_run.json`, a copy of `OUTPUT/zero_kit_run.json`) says which stage,
world size, model, tuning and precision wrote it. A new world size goes through DeepSpeed's universal checkpoint
(zero_kit.train.universal). A new ZeRO stage does not: DeepSpeed names a ZeRO-3 engine's model states per
data-parallel rank (`zero_pp_rank_R_mp_rank_00_model_states.pt`, engine `_get_ckpt_name`) and a ZeRO-1/2 engine's
once (`mp_rank_00_model_states.pt`), and its universal loader looks for its own stage's names; zero-kit has no test
of a 1 <-> 2 switch either. So a stage change, like another model, LoRA vs full (or another rank) and another
precision, is one error naming both runs and the three ways on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from zero_kit.dist import world_size_from_env
from zero_kit.errors import UserError
from zero_kit.train import checkpoint
from zero_kit.train.options import TrainOptions

EMBEDDED_MODEL = "the embedded tiny LLaMA"


@dataclass(frozen=True)
class RunShape:
    """What a checkpoint is tied to; None: not known (an older record, or decided only on the ranks)."""

    stage: int | None
    world_size: int | None
    model: str
    lora_r: int | None
    precision: str | None

    def describe(self) -> str:
        tuning = f"LoRA r={self.lora_r}" if self.lora_r is not None else "full fine-tuning"
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
    newest = checkpoint.newest_complete(Path(opts.output))
    own = newest if newest is not None and _recorded_job(newest) == job_id else None
    if speak:
        what = f"continuing from {own}, its newest complete checkpoint" if own else f"--resume {opts.resume} as given"
        print(
            f"zero-kit train: requeued by Slurm: restart {count} of job {job_id}; {what}", file=sys.stderr, flush=True
        )
    return opts if own is None or opts.resume == "auto" else dataclasses.replace(opts, resume=str(own))


def _recorded_job(ckpt: Path) -> str | None:
    try:
        return json.loads((ckpt / checkpoint.RUN_INFO).read_text(encoding="utf-8")).get(JOB_ID_KEY)
    except (OSError, ValueError, AttributeError):
        return None


def check_before_start(opts: TrainOptions, environ: dict[str, str]) -> Path | None:
    """The command's first seconds (before relaunch): name another tool's `checkpoint-N` once, check a
    `--resume CHECKPOINT_DIR`, and refuse a run that cannot continue the checkpoint it would take. Returns it."""
    output = Path(opts.output)
    others = checkpoint.foreign(output)
    if others and environ.get("RANK", "0") == "0":
        names = ", ".join(path.name for path in others)
        print(
            f"zero-kit train: warning: {names} in {output} was not written by zero-kit (no {checkpoint.MANIFEST}): "
            "left as it is, never resumed or deleted",
            file=sys.stderr,
            flush=True,
        )
    target = resume_target(opts)
    if target is not None:
        saved = recorded_shape(target)
        if saved is not None:
            check_fits(opts, saved, planned_shape(opts, environ), target)
    return target


def resume_target(opts: TrainOptions) -> Path | None:
    """auto: the newest complete zero-kit checkpoint in --output (None: start fresh); never: None; else the given
    directory, which must be a complete zero-kit checkpoint. Reads only: nothing is deleted here."""
    if opts.resume == "never":
        return None
    if opts.resume == "auto":
        return checkpoint.newest_complete(Path(opts.output))
    found = Path(opts.resume)
    if not checkpoint.is_complete(found):
        raise UserError(
            f"--resume {found}: not a complete zero-kit checkpoint (no {checkpoint.MANIFEST} or files missing)",
            "give a checkpoint-N directory written by zero-kit train, or use --resume auto",
        )
    return found


def recorded_shape(ckpt: Path) -> RunShape | None:
    """The run that wrote `ckpt`, from its copy of the run record (else OUTPUT's); None when neither is readable."""
    for path in (ckpt / checkpoint.RUN_INFO, ckpt.parent / checkpoint.RUN_INFO):
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            options = info["options"]
            return RunShape(
                stage=info.get("zero_stage"),
                world_size=info.get("world_size"),
                model=options.get("model") or EMBEDDED_MODEL,
                lora_r=options.get("lora_r"),
                precision=info.get("precision") or _explicit(options.get("precision")),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def planned_shape(opts: TrainOptions, environ: dict[str, str]) -> RunShape:
    """The new run as its flags (and a --ds-config file's stage) say, at the world size the launch will have."""
    return RunShape(
        stage=_planned_stage(opts),
        world_size=planned_world_size(opts, environ),
        model=opts.model or EMBEDDED_MODEL,
        lora_r=opts.lora_r,
        precision=_explicit(opts.precision),
    )


def planned_world_size(opts: TrainOptions, environ: dict[str, str]) -> int | None:
    """Resolved the way the launch will: a launcher's WORLD_SIZE (also SLURM's, already translated), else the
    hostfile's slots (each capped at --nproc, the launcher's --num_gpus), else --nproc, else 1."""
    try:
        launched, _ = world_size_from_env(environ)
    except ValueError:
        return None  # the rank reports the bad variable itself
    if launched:
        return launched
    if opts.hostfile:
        from zero_kit.launch import read_hostfile

        return sum(min(slots, opts.nproc) if opts.nproc else slots for _, slots in read_hostfile(opts.hostfile))
    return opts.nproc or 1


def _planned_stage(opts: TrainOptions) -> int | None:
    if opts.ds_config is None:
        return 2 if opts.stage is None else opts.stage
    from zero_kit.lint import Unreadable, read_config

    try:
        config, _ = read_config(opts.ds_config, "hf-trainer")
        stage = config.get("zero_optimization", {}).get("stage", 0)
    except (Unreadable, OSError, AttributeError):
        return None  # the ranks' lint of the file says what is wrong with it
    return stage if isinstance(stage, int) else None


def _explicit(precision: object) -> str | None:
    return precision if isinstance(precision, str) and precision != "auto" else None


def check_fits(opts: TrainOptions, saved: RunShape, new: RunShape, target: Path) -> None:
    """One error naming both runs and the three ways on, when `new` cannot continue `saved`'s checkpoint."""
    differs = [name for name in ("stage", "model", "lora_r", "precision") if _differ(saved, new, name)]
    if not differs:
        return
    what = {"stage": "ZeRO stage", "model": "model", "lora_r": "LoRA vs full (or LoRA rank)", "precision": "precision"}
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
    return "the checkpoint's flags: " + " ".join(flags)

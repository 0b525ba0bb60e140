"""The process that starts a `zero-kit train` job: it checks every input, claims --output, prepares the data, makes
the run's one plan (zero_kit.train.plan), checks that the resume and the memory fit, and starts the ranks.

Started plainly with `--nproc N` or `--hostfile` it re-launches the job under the `deepspeed` launcher through
zero_kit.launch (one supervisor: SIGINT and SIGTERM go straight to every rank, which finishes its step, saves and
exits; this process then says the one last line and exits 130 or 75, see zero_kit.train.stopping; a stall ends the
job with the watchdog's report and EXIT_STALLED). Its ranks receive the plan and start at zero_kit.train.rank. Alone
(one process), or as one rank of an outside launcher (torchrun, deepspeed, srun, accelerate), it goes on as that
rank itself.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from zero_kit.checkpoints.claim import hold_claim
from zero_kit.dist import RENDEZVOUS_PORT, free_port, slurm_to_torch_env, under_launcher
from zero_kit.launch import Launch, Launcher, from_hostfile, launch_commands, local, redact_argv, supervise
from zero_kit.launch.chatter import RunLog
from zero_kit.log import RUN_LOG, VERBOSE_ENV, say, warn
from zero_kit.model import check_trusted, hub_id, resolve_model
from zero_kit.options import options_to_argv
from zero_kit.train import resume, rundata, startup, stopping
from zero_kit.train.guards import fit, preflight
from zero_kit.train.guards.inputs import check_inputs
from zero_kit.train.guards.model_files import check_model_files
from zero_kit.train.options import TrainOptions, check_options
from zero_kit.train.plan import RunPlan, plan_run, this_host
from zero_kit.watchdog import HEARTBEAT_DIR

# `python -m deepspeed.launcher.runner`: the launcher of the running interpreter, also where no script is installed.
RUNNER = Launcher("deepspeed", program=(sys.executable, "-m", "deepspeed.launcher.runner"), no_local_rank=True)


def run_train(opts: TrainOptions) -> int:
    """Run `zero-kit train`; returns the process exit code (0; after SIGINT or SIGTERM see train.stopping)."""
    check_options(opts)
    if opts.verbose:
        os.environ[VERBOSE_ENV] = "1"  # this process and the ranks: OUTPUT/zero_kit.log's lines on the terminal too
    # data, model, output, hostfile: before the relaunch, a process group, an op build, any deletion or heavy import
    check_inputs(opts)
    srun_task = slurm_to_torch_env(dict(os.environ))  # an srun task is a rank: torch's variables from SLURM's
    environ = {**os.environ, **srun_task}
    # one job per output, taken before anything there is read to resume, deleted or written (checkpoints.claim)
    held = hold_claim(Path(opts.output), environ)
    try:
        os.environ.update(srun_task)  # DeepSpeed and the Trainer read them from the environment
        return _start(opts, environ, None if held.holder is None else held.holder.token)
    finally:
        held.release()


def _start(opts: TrainOptions, environ: dict[str, str], claim_token: str | None) -> int:
    # a Hub id -> its snapshot directory in the Hugging Face cache (downloaded now, once, if the user allows the
    # network): after every cheap check; the plan, the ranks and the run record get the directory
    given = opts.model
    opts = replace(opts, model=resolve_model(opts.model))
    check_trusted(opts.model, opts.trust_remote_code)  # before a launcher starts ranks that would each refuse it
    if hub_id(given) is not None:  # a local directory's files were checked with the other inputs
        check_model_files(opts, Path(opts.model))
    speak = environ.get("RANK", "0") == "0"
    opts = resume.continue_requeued_job(opts, environ, speak)  # Slurm requeued the job: never start over
    clock = startup.StartupClock()  # time to first step, by stage; a relaunch's ranks go on from its marks
    # the run's one plan, torch-free (a --ds-config file is linted here), and whether the checkpoint it would
    # continue fits it: a refusal in the command's first seconds, before any data is tokenized
    plan = plan_run(opts, environ, this_host(), claim_token=claim_token)
    resume.check_resume(plan, speak)
    if resume.already_done(plan, speak):  # a finished --max-steps run started again: nothing to train or export
        return 0
    preflight.refuse_no_room(plan.output, plan.planner(), plan.options)  # the checkpoints it keeps at once
    # tokenized once, before any launcher, process group or op build: a relaunch's ranks find it ready
    prepared = rundata.prepare(plan.options, speak)
    plan = decide_reference(plan, prepared, speak)  # --method dpo: precompute or a reference model, and why
    clock.mark("prepare")
    if speak and plan.resume_from is not None:
        _warn_if_foreign(Path(plan.resume_from))  # its pickles are loaded with weights_only=False by DeepSpeed
        resume.announce_changes(plan.options, Path(plan.resume_from), str(prepared.train.path))
    memory_note = fit.before_launch(plan, speak)  # the run against this host's RAM, before a launch or weights
    if _wants_relaunch(plan):
        return relaunch(plan, clock, memory_note=memory_note)
    from zero_kit.train.rank import run_rank

    return run_rank(plan, prepared, clock, led=False)


def decide_reference(plan: RunPlan, prepared: rundata.Prepared, speak: bool) -> RunPlan:
    """A DPO run's reference (zero_kit.train.preference.choose_reference) once its pairs are counted: the memory
    check and the ranks use this one decision, said here."""
    if plan.options.method != "dpo":
        return plan
    from zero_kit.train.preference import choose_reference

    per_step = plan.micro_batch * plan.grad_accum * plan.dp_size
    choice = choose_reference(plan.options, prepared.train.train_rows(), per_step)
    if speak:
        how = "precomputed log-probabilities" if choice.precompute else "a reference model every step"
        say(f"zero-kit train: DPO reference: {how} ({choice.reason})")
    return replace(plan, dpo_precompute=choice.precompute)


def _wants_relaunch(plan: RunPlan) -> bool:
    """Started plainly with several ranks asked for: re-launch under the `deepspeed` launcher."""
    return not under_launcher() and bool(plan.options.hostfile or plan.world_size > 1)


def relaunch_plan(opts: TrainOptions, nproc: int | None, port: int, environ: dict[str, str] | None = None) -> Launch:
    """N ranks on this host (`--num_gpus N`; on a CPU-only host DeepSpeed's CPU accelerator treats it as the number
    of ranks), or with `--hostfile` every host in the file, started over pdsh/ssh (N then caps the ranks per host).
    `--no_local_rank`: with --module the launcher would put --local_rank before our subcommand. The ranks' argv
    repeats the flags (what a process list shows); they run the plan in their environment."""
    where = from_hostfile(opts.hostfile, nproc or 0) if opts.hostfile else local(nproc or 1)
    args = ["train", *options_to_argv(opts, drop=("nproc", "master_port", "hostfile"))]
    return launch_commands("zero_kit.cli", args, where, RUNNER, port=port, run_dir=Path(opts.output).absolute(),
                           environ=environ)  # fmt: skip


def relaunch_command(opts: TrainOptions, nproc: int | None, port: int) -> list[str]:
    """The one launcher command of `relaunch_plan`."""
    return relaunch_plan(opts, nproc, port).argvs[0]


def relaunch(plan: RunPlan, clock: startup.StartupClock, argv: list[str] | None = None, *,
             memory_note: str | None = None) -> int:  # fmt: skip
    """Run the job's ranks under the `deepspeed` launcher, each with `plan`, and return the job's exit code. argv:
    this command's arguments, for the command that continues a stopped run (default: sys.argv). memory_note: the
    plan and its fix, said with a rank the kernel kills (zero_kit.train.guards.fit.memory_note)."""
    from zero_kit.checkpoints.claim import parent_env

    opts = plan.options
    # parent_env: the ranks on this host leave when this process is gone, whatever killed it (checkpoints.claim)
    env = {**os.environ, **plan.to_env(), **clock.for_ranks(), **parent_env(), "PYTHONUNBUFFERED": "1"}
    # With a hostfile the rendezvous is on the first host, whose free ports this host cannot see.
    port = opts.master_port or (RENDEZVOUS_PORT if opts.hostfile else free_port())
    launch = relaunch_plan(opts, opts.nproc, port, environ=env)
    say("zero-kit train: launching " + " ".join(redact_argv(launch.argvs[0][1:], env)))
    # The ranks stay in our process group: whoever ends this job by its group (a scheduler, a test) ends them too.
    # Every line of the launcher and the ranks goes to OUTPUT/zero_kit.log; the launcher's chatter only there.
    lines = RunLog(plan.output / RUN_LOG, verbose=os.environ.get(VERBOSE_ENV) == "1")
    try:
        outcome = supervise(launch, env=env, own_groups=False, stall_dir=plan.output / HEARTBEAT_DIR,
                            name="zero-kit train", memory_note=memory_note, output=lines.output())  # fmt: skip
    finally:
        lines.close()
    if lines.aftermath:
        warn(f"zero-kit train: the other ranks' {lines.aftermath} lines of errors that followed are in {lines.path}")
    # What the user did decides, not the ranks' and launchers' own codes; a signal sent to one rank only (its stop is
    # every rank's, which then exit 130 or 75) is said the same way. The line is said once, after every process ended.
    signum = outcome.signal or stopping.signal_of(outcome.exit_code)
    if signum is None:
        return outcome.exit_code
    warn(stopping.stop_line(signum, plan.output, sys.argv[1:] if argv is None else argv))
    return stopping.exit_code(signum)


def _warn_if_foreign(checkpoint_dir: Path) -> None:
    from zero_kit.model import foreign_warning

    warning = foreign_warning(checkpoint_dir, "--resume")
    if warning:
        warn(f"zero-kit train: {warning}")

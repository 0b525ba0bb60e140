"""`zero-kit train --nproc N` (or `--hostfile`) started plainly: run the same job again under the `deepspeed`
launcher, through zero_kit.launch (one supervisor: SIGINT and SIGTERM go straight to every rank, which finishes its
step, saves and exits; this process then prints the one last line and exits 130 or 75, see zero_kit.train.stopping;
a stall ends the job with the watchdog's report and EXIT_STALLED)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from zero_kit.dist import RENDEZVOUS_PORT, free_port
from zero_kit.launch import Launch, Launcher, from_hostfile, launch_commands, local, redact_argv, supervise
from zero_kit.options import options_to_argv
from zero_kit.train import stopping
from zero_kit.train.options import TrainOptions
from zero_kit.watchdog import HEARTBEAT_DIR

RELAUNCHED = "ZERO_KIT_RELAUNCHED"
# `python -m deepspeed.launcher.runner`: the launcher of the running interpreter, also where no script is installed.
RUNNER = Launcher("deepspeed", program=(sys.executable, "-m", "deepspeed.launcher.runner"), no_local_rank=True)


def relaunch_plan(opts: TrainOptions, nproc: int | None, port: int, environ: dict[str, str] | None = None) -> Launch:
    """N ranks on this host (`--num_gpus N`; on a CPU-only host DeepSpeed's CPU accelerator treats it as the number
    of ranks), or with `--hostfile` every host in the file, started over pdsh/ssh (N then caps the ranks per host).
    `--no_local_rank`: with --module the launcher would put --local_rank before our subcommand."""
    where = from_hostfile(opts.hostfile, nproc or 0) if opts.hostfile else local(nproc or 1)
    args = ["train", *options_to_argv(opts, drop=("nproc", "master_port", "hostfile"))]
    return launch_commands("zero_kit.cli", args, where, RUNNER, port=port, run_dir=Path(opts.output).absolute(),
                           environ=environ)  # fmt: skip


def relaunch_command(opts: TrainOptions, nproc: int | None, port: int) -> list[str]:
    """The one launcher command of `relaunch_plan`."""
    return relaunch_plan(opts, nproc, port).argvs[0]


def relaunch(opts: TrainOptions, nproc: int | None, argv: list[str] | None = None, *,
             memory_note: str | None = None) -> int:  # fmt: skip
    """Run the same job under the `deepspeed` launcher and return its exit code. argv: this command's arguments,
    for the command that continues a stopped run (default: sys.argv). memory_note: the plan and its fix, said
    with a rank the kernel kills (zero_kit.train.fit.memory_note)."""
    env = {**os.environ, RELAUNCHED: "1", "PYTHONUNBUFFERED": "1"}
    # With a hostfile the rendezvous is on the first host, whose free ports this host cannot see.
    port = opts.master_port or (RENDEZVOUS_PORT if opts.hostfile else free_port())
    plan = relaunch_plan(opts, nproc, port, environ=env)
    print("zero-kit train: launching", " ".join(redact_argv(plan.argvs[0][1:], env)), flush=True)
    # The ranks stay in our process group: whoever ends this job by its group (a scheduler, a test) ends them too.
    outcome = supervise(plan, env=env, own_groups=False, stall_dir=Path(opts.output) / HEARTBEAT_DIR,
                        name="zero-kit train", memory_note=memory_note)  # fmt: skip
    if outcome.signal is None:
        return outcome.exit_code
    # The ranks' and launchers' own codes say little here (the deepspeed launcher exits 1 when a terminal's Ctrl-C
    # reached it too): what the user did decides, and the line is printed once, after every process ended.
    print(stopping.stop_line(outcome.signal, Path(opts.output), sys.argv[1:] if argv is None else argv),
          file=sys.stderr, flush=True)  # fmt: skip
    return stopping.exit_code(outcome.signal)

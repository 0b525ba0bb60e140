"""`zero-kit train --nproc N` started plainly: run the same job again under the `deepspeed` launcher, forwarding
SIGTERM (preemption) to every rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from zero_kit.dist import free_port
from zero_kit.errors import UserError
from zero_kit.launch import ENV_FILE, write_rank_env
from zero_kit.options import options_to_argv
from zero_kit.train.options import TrainOptions

RELAUNCHED = "ZERO_KIT_RELAUNCHED"
DEFAULT_MASTER_PORT = 29500  # the deepspeed launcher's own default


def relaunch_command(opts: TrainOptions, nproc: int | None, port: int) -> list[str]:
    """`python -m deepspeed.launcher.runner ... --module zero_kit.cli train <same flags>`: N ranks on this host
    (`--num_gpus N`; on a CPU-only host DeepSpeed's CPU accelerator treats it as the number of ranks), or with
    `--hostfile` every host in the file, started over pdsh/ssh (N then caps the ranks per host)."""
    where = ["--hostfile", opts.hostfile] if opts.hostfile else []
    return [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        *where,
        *(["--num_gpus", str(nproc)] if nproc else []),
        "--master_port",
        str(port),
        "--no_local_rank",  # with --module the launcher would put --local_rank before our subcommand
        "--module",
        "zero_kit.cli",
        "train",
        *options_to_argv(opts, drop=("nproc", "master_port", "hostfile")),
    ]


def relaunch(opts: TrainOptions, nproc: int | None) -> int:
    """Run the same job under the `deepspeed` launcher and return its exit code."""
    env = {**os.environ, RELAUNCHED: "1", "PYTHONUNBUFFERED": "1"}
    if opts.hostfile:
        _check_hostfile(opts.hostfile)
        env["DS_ENV_FILE"] = str(write_rank_env(Path(opts.output).absolute() / ENV_FILE, env))
    # With a hostfile the rendezvous is on the first host, whose free ports this host cannot see.
    port = opts.master_port or (DEFAULT_MASTER_PORT if opts.hostfile else free_port())
    cmd = relaunch_command(opts, nproc, port)
    started = time.time()
    print("zero-kit train: launching", " ".join(cmd[1:]), flush=True)
    proc = subprocess.Popen(cmd, env=env)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _forward_to_ranks(proc.pid, signum))
    try:
        return _stall_aware(proc.wait(), Path(opts.output), started)
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stall_aware(code: int, output: Path, started: float) -> int:
    """The launcher's exit code, or EXIT_STALLED with the watchdog's report when the watchdog ended the job (the
    launcher then reports whichever rank it saw first: 76, or a signal for a rank that had to be killed)."""
    from zero_kit.watchdog import EXIT_STALLED, HEARTBEAT_DIR, read_marker

    report = read_marker(output / HEARTBEAT_DIR, started) if code != 0 else None
    if report is None:
        return code
    print(f"zero-kit train: the stall watchdog ended the job: {report}", file=sys.stderr, flush=True)
    return EXIT_STALLED


def _check_hostfile(path: str) -> None:
    """A missing or malformed hostfile is the user's mistake: say which line, before pdsh says something vaguer."""
    from zero_kit.launch import parse_hostfile

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise UserError(f"--hostfile {path}: cannot read it ({err.strerror})", "pass an existing hostfile") from None
    parse_hostfile(text, path)


def _forward_to_ranks(launcher_pid: int, signum: int) -> None:
    """SIGTERM (preemption) goes straight to every rank at once: the local `deepspeed` runner does not
    forward it, and launch.py would signal the ranks one after another. Each rank then saves and exits 75."""
    import psutil

    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for child in children:
        try:
            cmdline = child.cmdline()
            if "zero_kit.cli" in cmdline and not any("deepspeed.launcher" in part for part in cmdline):
                child.send_signal(signum)
        except psutil.Error:
            pass

"""`zero-kit train --nproc N` started plainly: run the same job again under the `deepspeed` launcher, forwarding
SIGTERM (preemption) to every rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from zero_kit.dist import free_port
from zero_kit.train.options import TrainOptions, options_to_argv

RELAUNCHED = "ZERO_KIT_RELAUNCHED"


def relaunch_command(opts: TrainOptions, nproc: int, port: int) -> list[str]:
    """`python -m deepspeed.launcher.runner --num_gpus N ... --module zero_kit.cli train <same flags>`.

    On a CPU-only host DeepSpeed's CPU accelerator treats --num_gpus as the number of ranks."""
    return [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--num_gpus",
        str(nproc),
        "--master_port",
        str(port),
        "--no_local_rank",  # with --module the launcher would put --local_rank before our subcommand
        "--module",
        "zero_kit.cli",
        "train",
        *options_to_argv(opts, drop=("nproc", "master_port")),
    ]


def relaunch(opts: TrainOptions, nproc: int) -> int:
    """Run the same job under the `deepspeed` launcher and return its exit code."""
    port = opts.master_port or free_port()
    cmd = relaunch_command(opts, nproc, port)
    env = {**os.environ, RELAUNCHED: "1", "PYTHONUNBUFFERED": "1"}
    print("zero-kit train: launching", " ".join(cmd[1:]), flush=True)
    proc = subprocess.Popen(cmd, env=env)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _forward_to_ranks(proc.pid, signum))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


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

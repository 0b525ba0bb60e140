"""Where this process runs: under a launcher (one rank), or started plainly (re-launch under `deepspeed`).

`deepspeed`, `torchrun` and `accelerate launch` all export RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
MASTER_PORT to each rank; SLURM's srun exports SLURM_PROCID / SLURM_NTASKS instead, which we translate.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from zero_kit.train_options import TrainOptions, options_to_argv

RELAUNCHED = "ZERO_KIT_RELAUNCHED"


def under_launcher(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return "WORLD_SIZE" in env and "RANK" in env


def end_process_group(finished: bool) -> None:
    """Destroy the default process group, if any. After a finished run the ranks meet once more first, so none
    tears down (or exits, which makes the `deepspeed` launcher kill the rest) while another still talks to it;
    after a failure they do not wait for each other."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def is_multi_rank_process() -> bool:
    """This process is one rank of a multi-rank job and has torch loaded."""
    return "torch" in sys.modules and under_launcher() and int(os.environ["WORLD_SIZE"] or 1) > 1


def exit_rank(code: int):
    """A rank whose work is done and saved leaves with os._exit, flushing its output first.

    Interpreter teardown runs C++ destructors of gloo/DeepSpeed objects while the other ranks are gone
    or being killed by the launcher (which terminates every rank once one exits non-zero, e.g. 75 after
    preemption); now and then that aborts (SIGABRT, "terminate called without an active exception") and
    the launcher then reports -6 instead of the rank's real exit code."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def slurm_to_torch_env(env: dict[str, str]) -> dict[str, str]:
    """srun started one task per rank: derive the torch.distributed variables from SLURM's (empty otherwise)."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env or under_launcher(env):
        return {}
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
        "MASTER_PORT": env.get("MASTER_PORT", "29500"),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def single_process_env(port: int) -> dict[str, str]:
    """A world of one, so DeepSpeed and the Trainer need no launcher for `zero-kit train` without --nproc."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


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

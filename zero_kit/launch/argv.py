"""The launchers' argv: the `deepspeed` launcher and `torchrun`, each built here and nowhere else.

Launchers are taken from the running interpreter's environment (`python -m torch.distributed.run`, the
`deepspeed` script next to `sys.executable`), so a venv's launcher is used even when it is not on PATH. Values may
be shell words (`"$SLURM_NODEID"`) where a script expands them on the node (see slurm.node_launcher_line).
"""

from __future__ import annotations

import sys
from pathlib import Path

Word = int | str
"""A number, or a shell word a script expands on the node."""


def deepspeed_launcher() -> str:
    return str(Path(sys.executable).parent / "deepspeed")


def deepspeed_command(
    module: str,
    args: list[str],
    *,
    nproc: Word | None,
    master_port: Word,
    hostfile: str | None = None,
    node_rank: Word | None = None,
    master_addr: str | None = None,
    launcher: str | list[str] | None = None,
    num_gpus: bool | None = None,
    no_local_rank: bool = False,
) -> list[str]:
    """The `deepspeed` launcher. With a hostfile and node_rank: `--no_ssh` mode, one launcher per node (SLURM srun,
    a netns prefix, a person), each starting its own local ranks; with a hostfile only: the launcher starts every
    host's ranks over pdsh/ssh; without: `--num_gpus nproc` on this host (on a CPU-only host DeepSpeed's CPU
    accelerator takes it as the number of ranks). `num_gpus` forces `--num_gpus nproc` on or off (a hostfile run
    capping the ranks per host); `no_local_rank`: no `--local_rank` before the module's own arguments."""
    command = [launcher] if isinstance(launcher, str) else list(launcher or [deepspeed_launcher()])
    if hostfile:
        command += ["--hostfile", hostfile]
        if node_rank is not None:
            command += ["--no_ssh", "--node_rank", str(node_rank)]
    if (not hostfile if num_gpus is None else num_gpus) and nproc:
        command += ["--num_gpus", str(nproc)]
    if master_addr:
        command += ["--master_addr", master_addr]
    command += ["--master_port", str(master_port)]
    return command + (["--no_local_rank"] if no_local_rank else []) + ["--module", module, *args]


def torchrun_command(
    module: str,
    args: list[str],
    *,
    nproc: Word,
    master_port: Word,
    nnodes: Word = 1,
    node_rank: Word = 0,
    master_addr: str = "127.0.0.1",
    python: str | None = None,
) -> list[str]:
    """`python -m torch.distributed.run` with a static rendezvous (same flags on every node but node_rank)."""
    return [
        python or sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes), "--node_rank", str(node_rank), "--nproc_per_node", str(nproc),
        "--master_addr", master_addr, "--master_port", str(master_port),
        "-m", module, *args,
    ]  # fmt: skip

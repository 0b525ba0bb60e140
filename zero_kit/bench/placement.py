"""Where a bench run's ranks go, and the processes that start them for one strategy:

- local: one launcher on this host (`deepspeed --num_gpus N` or torchrun), N = --nproc;
- hostfile: every host of --hostfile. ZeRO strategies: the deepspeed launcher over pdsh/ssh (remote ranks get
  their variables from a .deepspeed_env, see zero_kit.launch.write_rank_env); DDP/FSDP2: torchrun started on each
  host over the same ssh, static rendezvous on the first host;
- slurm: inside a multi-node SLURM allocation (SLURM_JOB_ID, SLURM_JOB_NUM_NODES > 1): one srun task per node,
  each running the launcher for its node (the same line `zero-kit launch --slurm` writes).

Ranks per node: the hostfile's slots, else --gpus-per-node, else --nproc. A local run always starts --nproc
ranks; with --gpus-per-node L below it, its ranks count as nproc / L nodes of L (link tiers, hpZ's secondary
partition, HSDP's mesh): two "nodes" on one host, to exercise the hierarchical strategies without a second one.
The results directory must be on a filesystem every node shares (rank 0 appends its record there)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zero_kit.bench.options import BenchOptions
from zero_kit.errors import UserError

Mode = Literal["local", "hostfile", "slurm"]


@dataclass(frozen=True)
class Placement:
    mode: Mode
    hosts: tuple[str, ...]
    """The nodes in rank order (empty for a local run)."""
    ranks_per_node: int
    launched_per_host: int = 0
    """Ranks one launcher starts on its host (0: ranks_per_node; a local run with simulated nodes: all of them)."""

    @property
    def nodes(self) -> int:
        if not self.hosts and self.launched_per_host:
            return self.launched_per_host // self.ranks_per_node
        return max(len(self.hosts), 1)

    def describe(self) -> dict:
        return {"mode": self.mode, "nodes": self.nodes, "ranks_per_node": self.ranks_per_node}


def in_slurm_allocation(environ: dict[str, str]) -> bool:
    return "SLURM_JOB_ID" in environ and int(environ.get("SLURM_JOB_NUM_NODES", "1") or 1) > 1


def place(opts: BenchOptions, environ: dict[str, str]) -> Placement:
    from zero_kit.launch import parse_hostfile, slurm_nodes

    if opts.hostfile:
        try:
            text = Path(opts.hostfile).read_text(encoding="utf-8")
        except OSError as err:
            raise UserError(f"--hostfile {opts.hostfile}: cannot read it ({err.strerror})", "pass a hostfile") from None
        hosts = parse_hostfile(text, opts.hostfile)
        slots = {n for _, n in hosts}
        if len(slots) != 1:
            raise UserError(
                f"--hostfile {opts.hostfile}: hosts have different slots {sorted(slots)}",
                "give every host the same slots=N (torchrun starts the same number of ranks on every node)",
            )
        return Placement("hostfile", tuple(h for h, _ in hosts), opts.gpus_per_node or slots.pop())
    if in_slurm_allocation(environ):
        return Placement("slurm", tuple(slurm_nodes(environ)), opts.gpus_per_node or opts.nproc)
    per_node = opts.gpus_per_node or opts.nproc
    if per_node < 1 or opts.nproc % per_node:
        raise UserError(
            f"--gpus-per-node {opts.gpus_per_node} does not divide --nproc {opts.nproc}",
            "on one host give --gpus-per-node a divisor of --nproc (the ranks then count as nproc/L nodes)",
        )
    return Placement("local", (), per_node, launched_per_host=opts.nproc)


def rank_args(strategy: str, opts: BenchOptions, record: str) -> list[str]:
    return ["--strategy", strategy, "--options-json", json.dumps(dataclasses.asdict(opts)), "--record", record]


def commands(strategy: str, opts: BenchOptions, port: int, record: str, where: Placement, run_dir: Path):
    """(argv list, extra environment) of the processes that start one strategy's ranks."""
    from zero_kit.launch import deepspeed_command, srun_command, torchrun_command, write_rank_env
    from zero_kit.strategies import check_name

    launcher = check_name(strategy).launcher
    args = rank_args(strategy, opts, record)
    if where.mode == "local":
        build = deepspeed_command if launcher == "deepspeed" else torchrun_command
        nproc = where.launched_per_host or where.ranks_per_node
        return [build("zero_kit.bench", args, nproc=nproc, master_port=port)], {}
    if where.mode == "slurm":
        hostfile = _write_hostfile(run_dir, where)
        env = {"MASTER_ADDR": where.hosts[0], "MASTER_PORT": str(port), "HOSTFILE": str(hostfile)}
        srun = srun_command(launcher, "zero_kit.bench", args, nodes=where.nodes, ranks_per_node=where.ranks_per_node)
        return [srun], env
    if launcher == "deepspeed":
        env_file = write_rank_env(run_dir / ".deepspeed_env", dict(os.environ))
        hostfile = _write_hostfile(run_dir, where)
        cmd = deepspeed_command("zero_kit.bench", args, nproc=where.ranks_per_node, master_port=port,
                                hostfile=str(hostfile), master_addr=where.hosts[0])  # fmt: skip
        return [cmd], {"DS_ENV_FILE": str(env_file)}
    return [_ssh_torchrun(args, where, node, port) for node in range(where.nodes)], {}


def _write_hostfile(run_dir: Path, where: Placement) -> Path:
    from zero_kit.launch import hostfile_text

    path = run_dir / "hostfile"
    path.write_text(hostfile_text(list(where.hosts), where.ranks_per_node), encoding="utf-8")
    return path


def _ssh_torchrun(args: list[str], where: Placement, node: int, port: int) -> list[str]:
    """torchrun on host `node` over ssh, in this directory, with the same variables the pdsh ranks get. -tt: when
    the driver stops the ssh client, the remote side gets SIGHUP, and torchrun stops its workers."""
    from zero_kit.launch import rank_env, torchrun_command

    cmd = torchrun_command("zero_kit.bench", args, nproc=where.ranks_per_node, master_port=port, nnodes=where.nodes,
                           node_rank=node, master_addr=where.hosts[0], python=sys.executable)  # fmt: skip
    variables = [f"{k}={v}" for k, v in rank_env(dict(os.environ)).items()]
    remote = f"cd {shlex.quote(os.getcwd())} && {shlex.join(['env', *variables, *cmd])}"
    return ["ssh", "-tt", "-o", "BatchMode=yes", where.hosts[node], remote]

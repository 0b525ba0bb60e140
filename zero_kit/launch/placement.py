"""Where ranks go (a Placement) and the one function that turns (module, args, placement, launcher) into the
processes to start (a Launch): `zero-kit train --nproc/--hostfile`, `zero-kit bench`, `zero-kit launch` (which
prints them) and the namespace rig all come through `launch_commands`.

- local: one launcher on this host with `local_ranks` ranks; `ranks_per_node` below it makes them count as
  local_ranks / ranks_per_node simulated nodes (the rank module reads that itself);
- hostfile: every host of a hostfile, reached by the launcher: the deepspeed launcher over pdsh/ssh (remote ranks get
  their variables from a .deepspeed_env, see hostfile.rank_env), torchrun started on each host over ssh;
- slurm: a multi-node SLURM allocation: one srun task per node, each running the launcher for its node;
- per_node: one launcher per node (deepspeed `--no_ssh --node_rank i`, torchrun `--node_rank i`), each started by
  its node's command prefix (`ip netns exec hostN env ...` on the namespace rig; none when printed for a person).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from zero_kit.dist import THREADS_ENV, rank_threads
from zero_kit.launch.argv import deepspeed_command, torchrun_command
from zero_kit.launch.hostfile import (
    ENV_FILE,
    SECRETS_DIR,
    hostfile_text,
    rank_env,
    rank_env_files,
    read_hostfile,
    secret_files,
    secret_reference,
)
from zero_kit.launch.secrets import write_private
from zero_kit.launch.slurm import slurm_nodes, srun_command

Mode = Literal["local", "hostfile", "slurm", "per_node"]
LauncherKind = Literal["deepspeed", "torchrun"]


@dataclass(frozen=True)
class Placement:
    mode: Mode
    hosts: tuple[str, ...] = ()
    """The nodes in rank order, names or addresses (empty for a local run)."""
    ranks_per_node: int = 0
    """Ranks per node (0 with a user's hostfile: its slots)."""
    local_ranks: int = 0
    """local: the ranks the one launcher starts on this host."""
    hostfile: str | None = None
    """A hostfile the launcher reads as it is (the user's); None: launch_commands writes one for `hosts`."""
    slots: tuple[int, ...] = ()
    """per_node: ranks of each node when they differ (else ranks_per_node)."""
    prefixes: tuple[tuple[str, ...], ...] = ()
    """per_node: the argv that runs a command on node i."""

    @property
    def nodes(self) -> int:
        if self.mode == "local":
            return self.local_ranks // self.ranks_per_node if self.ranks_per_node else 1
        return max(len(self.hosts), 1)

    def describe(self) -> dict:
        return {"mode": self.mode, "nodes": self.nodes, "ranks_per_node": self.ranks_per_node}

    def node_ranks(self, node: int) -> int:
        return self.slots[node] if self.slots else self.ranks_per_node


def local(nproc: int, ranks_per_node: int = 0) -> Placement:
    return Placement("local", (), ranks_per_node or nproc, local_ranks=nproc)


def from_hostfile(path: str, ranks_per_node: int = 0) -> Placement:
    """The hosts of the user's hostfile at `path` (checked: errors name file:line), handed to the launcher as it is;
    ranks_per_node > 0 caps the ranks per host (`--num_gpus`)."""
    hosts = read_hostfile(path)
    return Placement("hostfile", tuple(h for h, _ in hosts), ranks_per_node, hostfile=path)


def slurm_allocation(environ: dict[str, str], ranks_per_node: int) -> Placement:
    return Placement("slurm", tuple(slurm_nodes(environ)), ranks_per_node)


def per_node(hosts: list[tuple[str, int]], prefixes: list[tuple[str, ...]] | None = None,
             hostfile: str | None = None) -> Placement:  # fmt: skip
    """One launcher per (host, ranks); `prefixes[i]` starts node i's (default: none, for printing)."""
    slots = tuple(n for _, n in hosts)
    uneven = slots if len(set(slots)) > 1 else ()
    return Placement("per_node", tuple(h for h, _ in hosts), slots[0], hostfile=hostfile, slots=uneven,
                     prefixes=tuple(prefixes or [() for _ in hosts]))  # fmt: skip


@dataclass(frozen=True)
class Launcher:
    kind: LauncherKind
    program: tuple[str, ...] = ()
    """The launcher's own argv (default: this venv's deepspeed script, or this python's torchrun)."""
    no_local_rank: bool = False
    """deepspeed: no --local_rank before the module's arguments (a module with subcommands, zero_kit.cli)."""


@dataclass(frozen=True)
class Launch:
    """The processes that start one job's ranks, started together, and what they need first."""

    module: str
    argvs: list[list[str]]
    hosts: list[str] = field(default_factory=list)
    """Where each process runs ("" for this host)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables added to the environment of every process."""
    files: dict[Path, str] = field(default_factory=dict)
    """Files written before the start (a hostfile, the ranks' environment file)."""

    def write_files(self) -> None:
        """Each file 0600 from its first byte: the ranks' environment file may hold secrets (HF_TOKEN), and every
        file here is read by this user's own launcher and ranks alone."""
        for path, text in self.files.items():
            write_private(path, text)


def launch_commands(module: str, args: list[str], where: Placement, launcher: Launcher, *, port: int,
                    run_dir: Path = Path("."), master_addr: str | None = None,
                    environ: dict[str, str] | None = None) -> Launch:  # fmt: skip
    """The processes that start `module args` as ranks placed by `where`, rendezvous on `port`. Files the launch
    needs go to `run_dir`; `environ` is what remote ranks' variables are taken from (default: os.environ)."""
    environ = dict(os.environ if environ is None else environ)
    files = {}
    hostfile = where.hostfile
    if where.mode != "local" and not hostfile and (launcher.kind == "deepspeed" or where.mode == "slurm"):
        hostfile = str(run_dir / "hostfile")
        files[Path(hostfile)] = hostfile_text(list(where.hosts), where.ranks_per_node)
    master = master_addr or (where.hosts[0] if where.hosts else None)
    if where.mode == "local":
        return Launch(module, [_local(module, args, where, launcher, port)], [""], _local_threads(environ, where))
    if where.mode == "slurm":
        srun = srun_command(launcher.kind, module, args, nodes=where.nodes, ranks_per_node=where.ranks_per_node)
        env = {"MASTER_ADDR": master, "MASTER_PORT": str(port), "HOSTFILE": hostfile}
        return Launch(module, [srun], [""], env, files)
    if where.mode == "per_node":
        argvs = [[*where.prefixes[node], *_node(module, args, where, launcher, port, node, master, hostfile)]
                 for node in range(len(where.hosts))]  # fmt: skip
        return Launch(module, argvs, list(where.hosts), {}, files)
    if launcher.kind == "deepspeed":
        env_file = run_dir.absolute() / ENV_FILE
        files.update(rank_env_files(environ, env_file))
        cmd = _deepspeed(module, args, launcher, nproc=where.ranks_per_node, master_port=port, hostfile=hostfile,
                         master_addr=None if where.hostfile else master, num_gpus=bool(where.hostfile))  # fmt: skip
        return Launch(module, [cmd], [""], {"DS_ENV_FILE": str(env_file)}, files)
    secrets_dir = run_dir.absolute() / SECRETS_DIR
    files.update(secret_files(rank_env(environ), secrets_dir))
    argvs = [_ssh_torchrun(module, args, where, node, port, environ, secrets_dir) for node in range(where.nodes)]
    return Launch(module, argvs, list(where.hosts), {}, files)


def _local_threads(environ: dict[str, str], where: Placement) -> dict[str, str]:
    """OMP_NUM_THREADS for ranks on this host (zero_kit.dist.rank_threads), unless the user set it: torchrun would
    otherwise set 1 and warn. Ranks on other hosts count their own host's cores (zero_kit.dist.set_rank_threads)."""
    if environ.get(THREADS_ENV, "").strip():
        return {}
    cores = len(os.sched_getaffinity(0))
    return {THREADS_ENV: str(rank_threads({"LOCAL_WORLD_SIZE": str(where.local_ranks)}, cores))}


def _deepspeed(module: str, args: list[str], launcher: Launcher, **kwargs) -> list[str]:
    return deepspeed_command(module, args, launcher=list(launcher.program) or None,
                             no_local_rank=launcher.no_local_rank, **kwargs)  # fmt: skip


def _local(module: str, args: list[str], where: Placement, launcher: Launcher, port: int) -> list[str]:
    if launcher.kind == "deepspeed":
        return _deepspeed(module, args, launcher, nproc=where.local_ranks, master_port=port)
    return torchrun_command(module, args, nproc=where.local_ranks, master_port=port,
                            python=launcher.program[0] if launcher.program else None)  # fmt: skip


def _node(module: str, args: list[str], where: Placement, launcher: Launcher, port: int, node: int,
          master: str | None, hostfile: str | None) -> list[str]:  # fmt: skip
    """Node `node`'s own launcher: deepspeed `--no_ssh --node_rank` (the hostfile lists every node) or torchrun."""
    nproc = where.node_ranks(node)
    if launcher.kind == "deepspeed":
        return _deepspeed(module, args, launcher, nproc=nproc, master_port=port, hostfile=hostfile, node_rank=node,
                          master_addr=master)  # fmt: skip
    return torchrun_command(module, args, nproc=nproc, master_port=port, nnodes=len(where.hosts), node_rank=node,
                            master_addr=master or "127.0.0.1",
                            python=launcher.program[0] if launcher.program else None)  # fmt: skip


def _ssh_torchrun(module: str, args: list[str], where: Placement, node: int, port: int,
                  environ: dict[str, str], secrets_dir: Path) -> list[str]:  # fmt: skip
    """torchrun on host `node` over ssh, in this directory, with the same variables the pdsh ranks get (a secret
    read there from its file in `secrets_dir`, so ssh's command line carries none). -tt: when the supervisor stops
    the ssh client, the remote side gets SIGHUP, and torchrun stops its workers."""
    cmd = torchrun_command(module, args, nproc=where.ranks_per_node, master_port=port, nnodes=where.nodes,
                           node_rank=node, master_addr=where.hosts[0], python=sys.executable)  # fmt: skip
    variables = rank_env(environ)
    apart = secret_files(variables, secrets_dir)
    plain = [f"{k}={v}" for k, v in variables.items() if secrets_dir / k not in apart]
    secret = "".join(f' {path.name}="{secret_reference(path)}"' for path in apart)
    remote = f"cd {shlex.quote(os.getcwd())} && {shlex.join(['env', *plain])}{secret} {shlex.join(cmd)}"
    return ["ssh", "-tt", "-o", "BatchMode=yes", where.hosts[node], remote]

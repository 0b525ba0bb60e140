"""`zero-kit launch`: the launch material for multi-node runs. With --hostfile FILE it checks the hostfile and
prints the per-node launcher commands; with --slurm it writes (or prints) an sbatch script; --write-hostfile
writes a pdsh/deepspeed hostfile for --hosts. The command to launch defaults to a `zero-kit bench` rank."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from zero_kit.dist import MULTI_NODE_PORT
from zero_kit.errors import UserError, check_writable_file, refuse_overwrite, write_text
from zero_kit.launch import add_slurm_arguments
from zero_kit.launch.slurm import DEFAULT_GPUS_PER_NODE, DEFAULT_NODES, fill_size
from zero_kit.options import port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--hostfile", metavar="FILE", help="existing hostfile: check it, print per-node commands")
    mode.add_argument("--slurm", action="store_true", help="write a SLURM sbatch script (srun starts the ranks)")
    mode.add_argument("--write-hostfile", metavar="FILE", help="write a hostfile for --hosts (HOST slots=N lines)")
    parser.add_argument("--launcher", choices=("deepspeed", "torchrun", "srun"), default=None,
                        help="deepspeed (ZeRO, --no_ssh per node), torchrun (DDP/FSDP2, static rendezvous) or srun"
                        " (--slurm only: srun starts every rank, so a preempted run's 75 is the job's exit code);"
                        " default: srun for --slurm -- train, else deepspeed")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=None, help=f"number of nodes (SLURM; default {DEFAULT_NODES})")
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help=f"ranks per node (hostfile slots; default {DEFAULT_GPUS_PER_NODE})",
    )
    parser.add_argument("--hosts", default="", help="comma-separated host names for --write-hostfile")
    parser.add_argument("--master-addr", default=None, help="first node's address (default: first hostfile host)")
    parser.add_argument("--master-port", type=port, default=MULTI_NODE_PORT, help="rendezvous port (1..65535)")
    parser.add_argument(
        "--module",
        default=None,
        help="python module each rank runs (default: zero_kit.cli when the arguments after -- start with a"
        " zero-kit command such as train, else a zero-kit bench rank, zero_kit.bench)",
    )
    add_slurm_arguments(parser, "launch")
    parser.add_argument("--venv", default=None, help="virtual environment each node activates (default: this one)")
    parser.add_argument("-o", "--output", default=None, help="write the script here instead of printing it")
    parser.add_argument(
        "--force", action="store_true", help="let -o or --write-hostfile replace a file zero-kit did not write"
    )
    parser.add_argument("module_args", nargs=argparse.REMAINDER, help="arguments after -- go to the module")


RANK_COMMANDS = ("train",)
"""zero-kit commands that run as one rank under a launcher (`-- train ...` runs `zero_kit.cli train ...`)."""


def _module_args(args: argparse.Namespace) -> list[str]:
    rest = list(args.module_args)
    return rest[1:] if rest[:1] == ["--"] else rest


def _module(args: argparse.Namespace) -> str:
    if args.module:
        return args.module
    return "zero_kit.cli" if _module_args(args)[:1] and _module_args(args)[0] in RANK_COMMANDS else "zero_kit.bench"


def _launcher(args: argparse.Namespace) -> str:
    """srun for a zero-kit rank command under --slurm (it reads SLURM's variables, and only with srun do a
    preempted run's exit code 75 and its save's grace come through), else the deepspeed launcher."""
    if args.launcher == "srun" and not args.slurm:
        raise UserError("--launcher srun needs --slurm", "use --launcher deepspeed or torchrun with --hostfile")
    if args.launcher:
        return args.launcher
    return "srun" if args.slurm and _module(args) == "zero_kit.cli" else "deepspeed"


def _is_launch_output(path: Path) -> bool:
    """The mark of what `launch -o` writes, read from its first lines: an sbatch script of ours (`#!/bin/bash`
    then `#SBATCH --job-name=`) or per-node commands (`# on HOST`)."""
    try:
        head = path.read_text(encoding="utf-8")[:200]
    except (OSError, ValueError):
        return False
    return head.startswith(("#!/bin/bash\n#SBATCH --job-name=", "# on "))


def _is_hostfile_output(path: Path) -> bool:
    """The mark of what `--write-hostfile` writes: only `HOST slots=N` lines, no comment, no blank line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return False
    return bool(lines) and all(re.fullmatch(r"\S+ slots=\d+", line) for line in lines)


def _check_outputs(args: argparse.Namespace) -> None:
    """Before anything is read or printed: the files this run writes can be written and hold nothing of the user's."""
    if args.output:
        check_writable_file(args.output, "-o")
        refuse_overwrite(args.output, "-o", args.force, _is_launch_output)
    if args.write_hostfile:
        check_writable_file(args.write_hostfile, "--write-hostfile")
        refuse_overwrite(args.write_hostfile, "--write-hostfile", args.force, _is_hostfile_output)


def _emit(text: str, output: str | None, flag: str = "-o") -> None:
    if output:
        write_text(output, text, flag)
        print(f"wrote {output}", file=sys.stderr)
    else:
        print(text, end="")


def _per_node_commands(args: argparse.Namespace) -> str:
    """What each node runs, as zero_kit.launch would start it: one launcher per node (`--no_ssh --node_rank i`,
    or torchrun's static rendezvous), the hostfile read as it is."""
    from zero_kit.launch import Launcher, launch_commands, per_node, read_hostfile

    where = per_node(read_hostfile(args.hostfile), hostfile=args.hostfile)
    kind = _launcher(args)
    launcher = Launcher(kind, program=("deepspeed",) if kind == "deepspeed" else ("python",))
    launch = launch_commands(_module(args), _module_args(args), where, launcher, port=args.master_port,
                             master_addr=args.master_addr)  # fmt: skip
    return (
        "\n".join(f"# on {host}\n{shlex.join(cmd)}" for host, cmd in zip(launch.hosts, launch.argvs, strict=True))
        + "\n"
    )


def run(args: argparse.Namespace) -> int:
    from zero_kit.launch import SlurmJob, hostfile_text, sbatch_script

    _check_outputs(args)
    if args.write_hostfile:
        hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
        if not hosts:
            raise UserError("--write-hostfile needs --hosts", "pass --hosts node1,node2")
        if len(set(hosts)) != len(hosts):
            twice = sorted({h for h in hosts if hosts.count(h) > 1})
            raise UserError(f"--hosts names {', '.join(twice)} more than once", "list each host once")
        slots = DEFAULT_GPUS_PER_NODE if args.gpus_per_node is None else args.gpus_per_node
        if args.gpus_per_node is None:
            print(f"zero-kit launch: slots={slots} per host (--gpus-per-node not given: default)", file=sys.stderr)
        _emit(hostfile_text(hosts, slots), args.write_hostfile, "--write-hostfile")
    elif args.slurm:
        nodes, gpus_per_node = fill_size(args.nodes, args.gpus_per_node, "launch")
        job = SlurmJob(nodes=nodes, gpus_per_node=gpus_per_node, launcher=_launcher(args), module=_module(args),
                       args=tuple(_module_args(args)), job_name=args.job_name, time=args.time,
                       partition=args.partition, master_port=args.master_port, venv=args.venv)  # fmt: skip
        _emit(sbatch_script(job), args.output)
    else:
        _emit(_per_node_commands(args), args.output)
    return 0

"""SLURM: sbatch scripts, the line srun runs on every node, the allocation's nodes, and the SLURM flags that
`zero-kit launch` and `zero-kit bench --slurm` share (declared once, with each command's defaults)."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zero_kit.dist import MULTI_NODE_PORT
from zero_kit.errors import UserError
from zero_kit.launch.argv import deepspeed_command, torchrun_command
from zero_kit.log import warn

SlurmLauncher = Literal["deepspeed", "torchrun", "srun"]


@dataclass(frozen=True)
class SlurmDefaults:
    job_name: str
    time: str


SLURM_DEFAULTS = {
    "launch": SlurmDefaults(job_name="zero-kit", time="01:00:00"),
    "bench": SlurmDefaults(job_name="zero-kit-bench", time="02:00:00"),  # every strategy, one after another
}
"""Per command: the job name and the time limit its sbatch script asks for."""

DEFAULT_NODES = 2
DEFAULT_GPUS_PER_NODE = 8


def fill_size(nodes: int | None, gpus_per_node: int | None, command: str) -> tuple[int, int]:
    """--nodes and --gpus-per-node as given, the defaults for those left out, said on stderr when one was: the
    size of an allocation is its cost, and 2 x 8 GPUs should never be a surprise."""
    filled = (
        DEFAULT_NODES if nodes is None else nodes,
        DEFAULT_GPUS_PER_NODE if gpus_per_node is None else gpus_per_node,
    )
    missing = [flag for flag, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)) if value is None]
    if missing:
        warn(
            f"zero-kit {command}: {filled[0]} node{'s' * (filled[0] != 1)} x {filled[1]} GPUs ({' and '.join(missing)} not given: defaults);"
            f" pass {' and '.join(missing)} to change it"
        )
    return filled


def add_slurm_arguments(parser: argparse.ArgumentParser, command: Literal["launch", "bench"]) -> None:
    """--job-name, --time and --partition, with `command`'s defaults."""
    defaults = SLURM_DEFAULTS[command]
    note = " (with --slurm)" if command == "bench" else ""
    parser.add_argument("--job-name", default=defaults.job_name, help=f"SLURM job name{note}")
    parser.add_argument("--time", default=defaults.time, help=f"SLURM time limit{note}")
    parser.add_argument("--partition", default=None, help=f"SLURM partition{note}")


@dataclass(frozen=True)
class SlurmJob:
    nodes: int
    gpus_per_node: int
    launcher: SlurmLauncher
    module: str
    args: tuple[str, ...]
    job_name: str = SLURM_DEFAULTS["launch"].job_name
    time: str = SLURM_DEFAULTS["launch"].time
    partition: str | None = None
    master_port: int = MULTI_NODE_PORT
    venv: str | None = None
    """Directory of the virtual environment to activate on every node (default: the current one)."""


def _sbatch_head(job: SlurmJob, more: tuple[str, ...] = ()) -> list[str]:
    if job.nodes < 1 or job.gpus_per_node < 1:
        raise UserError(f"need --nodes >= 1 and --gpus-per-node >= 1, got {job.nodes} and {job.gpus_per_node}")
    venv = job.venv or str(Path(sys.executable).parent.parent)
    return [
        "#!/bin/bash",
        f"#SBATCH --job-name={job.job_name}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.gpus_per_node if job.launcher == 'srun' else 1}",
        f"#SBATCH --gpus-per-node={job.gpus_per_node}",
        f"#SBATCH --time={job.time}",
        *([f"#SBATCH --partition={job.partition}"] if job.partition else []),
        *more,
        "set -euo pipefail",
        f"source {shlex.quote(venv)}/bin/activate",
    ]


def bench_sbatch_script(job: SlurmJob, bench_args: list[str]) -> str:
    """SLURM batch script running a whole `zero-kit bench` in one allocation: the driver runs on the first node
    and starts every strategy across all nodes with srun, one after another, into one results directory."""
    body = [
        "# zero-kit bench inside the allocation: one srun per strategy (deepspeed --no_ssh or torchrun per node).",
        f"python -m zero_kit.cli bench {' '.join(shlex.quote(a) for a in bench_args)}",
    ]
    return "\n".join(_sbatch_head(job) + body) + "\n"


REQUEUE_LINES = (
    "# Requeue (node failure, preemption, scontrol requeue) runs this script again from its top, same job id:",
    "# `zero-kit train` then continues from the newest complete checkpoint the job wrote (docs/clusters.md).",
    'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
    '  echo "zero-kit: requeued: restart $SLURM_RESTART_COUNT of job $SLURM_JOB_ID on $SLURM_JOB_NODELIST" >&2',
    "fi",
)
"""What a train script says when Slurm runs it again; the `#SBATCH` lines that go with it are in REQUEUE_HEAD."""
REQUEUE_HEAD = ("#SBATCH --requeue", "#SBATCH --open-mode=append")
"""Requeue asked for explicitly (a site's JobRequeue=0 would otherwise end the job at a node failure), and the
output file appended to: Slurm truncates it when it starts a requeued job (JobFileAppend=0, the default), which
would erase what the interrupted runs printed."""


def sbatch_script(job: SlurmJob) -> str:
    """SLURM batch script. `srun`: srun starts every rank itself (one task per GPU; the ranks read SLURM's
    variables, as `zero-kit train` does). `deepspeed`/`torchrun`: one srun task per node, each running the
    deepspeed launcher (`--no_ssh`, node rank from SLURM_NODEID) or torchrun (static rendezvous on the first node).
    No --kill-on-bad-exit: it SIGTERMs the other ranks (which a rank takes for preemption) and the job then reports
    143 instead of the failed rank's code; the others fail on their own (their peer is gone), or the stall watchdog
    ends them. A lost node ends the job only when Slurm declares it DOWN (SlurmdTimeout), with or without it."""
    args = " ".join(shlex.quote(a) for a in job.args)
    head = [
        *_sbatch_head(job, REQUEUE_HEAD),
        *REQUEUE_LINES,
        # sed reads to the end: `head -n 1` exits first and, under pipefail, scontrol's SIGPIPE fails the script (141)
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        f"MASTER_PORT={job.master_port}",
        "export MASTER_ADDR MASTER_PORT",
    ]
    if job.launcher == "srun":
        # No launcher between Slurm and the ranks: a SIGTERM to the steps (scancel --signal=TERM, sbatch
        # --signal=TERM@N) reaches only the ranks, which save and exit 75, and srun exits with the ranks' own code
        # (75, 76), the job's. A per-node launcher dies of the same SIGTERM (143) and SIGKILLs a save after 30 s.
        body = [
            "# srun starts every rank (RANK, WORLD_SIZE, LOCAL_RANK from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID).",
            f"srun python -u -m {job.module} {args}".rstrip(),
        ]
        return "\n".join(head + body) + "\n"
    # Each srun task expands $SLURM_NODEID itself (single quotes); the user's arguments follow as "$@".
    if job.launcher == "deepspeed":
        body = [
            "# The deepspeed launcher reads the node list from a hostfile; --no_ssh: srun starts it on every node.",
            'export HOSTFILE="${SLURM_SUBMIT_DIR:-.}/hostfile.$SLURM_JOB_ID"',
            f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/ slots={job.gpus_per_node}/" > "$HOSTFILE"',
        ]
    else:
        body = ["# torchrun with a static rendezvous: every node dials MASTER_ADDR:MASTER_PORT."]
    line = node_launcher_line(job.launcher, job.module, job.nodes, job.gpus_per_node)
    body.append(f"srun --ntasks-per-node=1 bash -c {shlex.quote(line)} node {args}")
    return "\n".join(head + body) + "\n"


def node_launcher_line(launcher: str, module: str, nodes: int, ranks_per_node: int) -> str:
    """What srun runs on every node, as bash: the argv builders' deepspeed launcher in `--no_ssh` mode (node list
    in $HOSTFILE) or torchrun with a static rendezvous; $SLURM_NODEID, $MASTER_ADDR and $MASTER_PORT expand on the
    node, the rank module's arguments follow as "$@"."""
    node, addr, port = '"$SLURM_NODEID"', '"$MASTER_ADDR"', '"$MASTER_PORT"'
    if launcher == "deepspeed":
        argv = deepspeed_command(module, ['"$@"'], nproc=None, master_port=port, hostfile='"$HOSTFILE"',
                                 node_rank=node, master_addr=addr, launcher="deepspeed")  # fmt: skip
    else:
        argv = torchrun_command(module, ['"$@"'], nproc=ranks_per_node, master_port=port, nnodes=nodes,
                                node_rank=node, master_addr=addr, python="python")  # fmt: skip
    return " ".join(argv)


def srun_command(launcher: str, module: str, args: list[str], *, nodes: int, ranks_per_node: int) -> list[str]:
    """Inside an allocation: one srun task per node, each running `node_launcher_line` (the caller exports
    MASTER_ADDR, MASTER_PORT and, for deepspeed, HOSTFILE)."""
    line = node_launcher_line(launcher, module, nodes, ranks_per_node)
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "bash", "-c", line, "node", *args]


def in_slurm_allocation(environ: dict[str, str]) -> bool:
    """Inside a multi-node allocation (a one-node allocation is run as a local launch)."""
    return "SLURM_JOB_ID" in environ and int(environ.get("SLURM_JOB_NUM_NODES", "1") or 1) > 1


def slurm_nodes(environ: dict[str, str]) -> list[str]:
    """The allocation's host names, in SLURM's order (`scontrol show hostnames`)."""
    import subprocess

    done = subprocess.run(
        ["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise UserError(f"scontrol show hostnames failed: {done.stderr.strip()}", "run inside a SLURM allocation")
    return done.stdout.split()

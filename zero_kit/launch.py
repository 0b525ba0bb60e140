"""Launch commands and files: the `deepspeed` launcher (hostfile, `--no_ssh`), `torchrun` (static
rendezvous), pdsh hostfiles and SLURM sbatch scripts. Pure text/argv builders: nothing here runs anything.

Launchers are taken from the running interpreter's environment (`python -m torch.distributed.run`, the
`deepspeed` script next to `sys.executable`), so a venv's launcher is used even when it is not on PATH.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zero_kit.errors import UserError

_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]*$")
# Ranks started over pdsh/ssh get only what the deepspeed launcher exports (PYTHON* and the lines of
# .deepspeed_env, see write_rank_env); these are the variables a run may need there too.
RANK_ENV_PREFIXES = ("ZERO_KIT_", "TORCH_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "NCCL_", "GLOO_", "OMP_")
ENV_FILE = ".deepspeed_env"


def deepspeed_launcher() -> str:
    return str(Path(sys.executable).parent / "deepspeed")


def torchrun_command(
    module: str,
    args: list[str],
    *,
    nproc: int,
    master_port: int,
    nnodes: int = 1,
    node_rank: int = 0,
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


def deepspeed_command(
    module: str,
    args: list[str],
    *,
    nproc: int,
    master_port: int,
    hostfile: str | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    launcher: str | None = None,
) -> list[str]:
    """The `deepspeed` launcher. With a hostfile and node_rank: `--no_ssh` mode, one launcher per node
    (SLURM srun or netns), each starting its own local ranks; without: `--num_gpus nproc` on this host."""
    command = [launcher or deepspeed_launcher()]
    if hostfile:
        command += ["--hostfile", hostfile]
        if node_rank is not None:
            command += ["--no_ssh", "--node_rank", str(node_rank)]
    else:
        command += ["--num_gpus", str(nproc)]
    if master_addr:
        command += ["--master_addr", master_addr]
    return command + ["--master_port", str(master_port), "--module", module, *args]


def hostfile_text(hosts: list[str], slots: int) -> str:
    """pdsh/deepspeed hostfile: one `HOST slots=N` line per node."""
    for host in hosts:
        if not _HOST.match(host):
            raise UserError(f"invalid host name {host!r} in the host list", "use plain host names or IP addresses")
    if slots < 1:
        raise UserError(f"--gpus-per-node must be at least 1, got {slots}", "pass --gpus-per-node N with N >= 1")
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def parse_hostfile(text: str, source: str = "hostfile") -> list[tuple[str, int]]:
    """(host, slots) per non-comment line; every malformed line is reported at once."""
    hosts, problems = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+)\s+slots=(\d+)", line)
        if not match or not _HOST.match(match.group(1)) or int(match.group(2)) < 1:
            problems.append(f"{source}:{number}: {raw.strip()!r}")
            continue
        hosts.append((match.group(1), int(match.group(2))))
    if problems or not hosts:
        raise UserError(
            "bad hostfile lines:\n  " + "\n  ".join(problems) if problems else f"{source} lists no hosts",
            "write one 'HOST slots=N' line per node, e.g. 'node1 slots=8'",
        )
    return hosts


@dataclass(frozen=True)
class SlurmJob:
    nodes: int
    gpus_per_node: int
    launcher: Literal["deepspeed", "torchrun", "srun"]
    module: str
    args: tuple[str, ...]
    job_name: str = "zero-kit"
    time: str = "01:00:00"
    partition: str | None = None
    master_port: int = 29700
    venv: str | None = None
    """Directory of the virtual environment to activate on every node (default: the current one)."""


def _sbatch_head(job: SlurmJob) -> list[str]:
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


def sbatch_script(job: SlurmJob) -> str:
    """SLURM batch script. `srun`: srun starts every rank itself (one task per GPU; the ranks read SLURM's
    variables, as `zero-kit train` does). `deepspeed`/`torchrun`: one srun task per node, each running the
    deepspeed launcher (`--no_ssh`, node rank from SLURM_NODEID) or torchrun (static rendezvous on the first node).
    No --kill-on-bad-exit: it SIGTERMs the other ranks (which a rank takes for preemption) and the job then reports
    143 instead of the failed rank's code; the others fail on their own (their peer is gone), or the stall watchdog
    ends them. A lost node ends the job only when Slurm declares it DOWN (SlurmdTimeout), with or without it."""
    args = " ".join(shlex.quote(a) for a in job.args)
    head = [
        *_sbatch_head(job),
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
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
    """What srun runs on every node, as bash: the deepspeed launcher in `--no_ssh` mode (node list in $HOSTFILE)
    or torchrun with a static rendezvous; $SLURM_NODEID, $MASTER_ADDR and $MASTER_PORT expand on the node, the
    rank module's arguments follow as "$@"."""
    if launcher == "deepspeed":
        return (
            'deepspeed --hostfile "$HOSTFILE" --no_ssh --node_rank "$SLURM_NODEID"'
            f' --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" --module {module} "$@"'
        )
    return (
        f"python -m torch.distributed.run --nnodes {nodes}"
        f' --node_rank "$SLURM_NODEID" --nproc_per_node {ranks_per_node}'
        f' --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" -m {module} "$@"'
    )


def srun_command(launcher: str, module: str, args: list[str], *, nodes: int, ranks_per_node: int) -> list[str]:
    """Inside an allocation: one srun task per node, each running `node_launcher_line` (the caller exports
    MASTER_ADDR, MASTER_PORT and, for deepspeed, HOSTFILE)."""
    line = node_launcher_line(launcher, module, nodes, ranks_per_node)
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "bash", "-c", line, "node", *args]


def slurm_nodes(environ: dict[str, str]) -> list[str]:
    """The allocation's host names, in SLURM's order (`scontrol show hostnames`)."""
    import subprocess

    done = subprocess.run(
        ["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise UserError(f"scontrol show hostnames failed: {done.stderr.strip()}", "run inside a SLURM allocation")
    return done.stdout.split()


def rank_env(environ: dict[str, str], user_file: Path = Path(ENV_FILE)) -> dict[str, str]:
    """The variables ranks started over pdsh/ssh need: those of `environ` a run may use remotely (not network
    interface names, which differ per host), PATH with this venv first, plus the user's own ./.deepspeed_env
    lines (which win)."""
    lines = {
        k: v
        for k, v in sorted(environ.items())
        if k.startswith(RANK_ENV_PREFIXES) and not k.endswith("_SOCKET_IFNAME") and "\n" not in v
    }
    # The venv first: the launcher starts the venv's python by its path, but tools the ranks call (ninja, for
    # DeepSpeed's op builds) come from PATH, and two ninja versions rebuild each other's builds every run.
    lines["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), environ.get("PATH")]))
    if user_file.is_file():
        for raw in user_file.read_text(encoding="utf-8").splitlines():
            if "=" in raw and not raw.lstrip().startswith("#"):
                name, value = raw.split("=", 1)
                lines[name.strip()] = value
    return lines


def write_rank_env(path: Path, environ: dict[str, str], user_file: Path = Path(ENV_FILE)) -> Path:
    """`rank_env` as DeepSpeed's env file (point DS_ENV_FILE at it). No blank lines: the launcher crashes on one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in rank_env(environ, user_file).items()), encoding="utf-8")
    return path

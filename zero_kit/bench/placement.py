"""Where a bench run's ranks go (zero_kit.launch.Placement), by the bench's own rules:

- local: one launcher on this host (`deepspeed --num_gpus N` or torchrun), N = --nproc;
- hostfile: every host of --hostfile, whose slots must agree (torchrun starts the same number on every node);
- slurm: inside a multi-node SLURM allocation (SLURM_JOB_ID, SLURM_JOB_NUM_NODES > 1): one srun task per node,
  each running the launcher for its node (the same line `zero-kit launch --slurm` writes).

Ranks per node: --gpus-per-node, else the hostfile's slots, else --nproc. A local run always starts --nproc
ranks; with --gpus-per-node L below it, its ranks count as nproc / L nodes of L (link tiers, hpZ's secondary
partition, HSDP's mesh): two "nodes" on one host, to exercise the hierarchical strategies without a second one.
The results directory must be on a filesystem every node shares (rank 0 appends its record there)."""

from __future__ import annotations

import dataclasses
import json

from zero_kit.bench.options import BenchOptions
from zero_kit.errors import UserError
from zero_kit.launch import Placement, in_slurm_allocation, local, read_hostfile, slurm_allocation


def place(opts: BenchOptions, environ: dict[str, str]) -> Placement:
    if opts.hostfile:
        hosts = read_hostfile(opts.hostfile)
        slots = {n for _, n in hosts}
        if len(slots) != 1:
            raise UserError(
                f"--hostfile {opts.hostfile}: hosts have different slots {sorted(slots)}",
                "give every host the same slots=N (torchrun starts the same number of ranks on every node)",
            )
        # Its own hostfile (launch_commands writes it): --gpus-per-node may ask for fewer ranks than the slots.
        return Placement("hostfile", tuple(h for h, _ in hosts), opts.gpus_per_node or slots.pop())
    if in_slurm_allocation(environ):
        return slurm_allocation(environ, opts.gpus_per_node or opts.nproc)
    per_node = opts.gpus_per_node or opts.nproc
    if per_node < 1 or opts.nproc % per_node:
        raise UserError(
            f"--gpus-per-node {opts.gpus_per_node} does not divide --nproc {opts.nproc}",
            "on one host give --gpus-per-node a divisor of --nproc (the ranks then count as nproc/L nodes)",
        )
    return local(opts.nproc, per_node)


def rank_args(strategy: str, opts: BenchOptions, record: str) -> list[str]:
    """The arguments of one bench rank (`python -m zero_kit.bench`)."""
    return ["--strategy", strategy, "--options-json", json.dumps(dataclasses.asdict(opts)), "--record", record]

"""The whole DDP / FSDP2 / ZeRO comparison as ONE job on a real two-node Slurm cluster (two network-namespace
hosts on this machine, tests/rigs/slurm.py), submitted exactly as a user would:

    python -m benchmarks.cluster_slurm.run --out benchmarks/cluster_slurm/results

It writes the sbatch script with `zero-kit bench --slurm --nodes 2 --gpus-per-node 1 ...`, submits it with
`sbatch --wait`, and leaves in --out the script, the results directory (results.jsonl, table.md, plots, logs)
and COMMAND.txt. Root only; the rig (prefix zkbr, 10.78.58.x) is removed on exit, also on failure.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from tests.rigs import slurm_cluster
from tests.rigs.base import build_cpu_ops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/cluster_slurm/results")
    parser.add_argument("--strategies", default="ddp,fsdp,zero1,zero2,zero3")
    parser.add_argument("--steps", default="20")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    script = out / "bench.sbatch"
    write = [str(Path(sys.executable).parent / "zero-kit"), "bench", "--slurm", "--nodes", "2", "--gpus-per-node", "1",
             "--strategies", args.strategies, "--steps", args.steps, "--master-port", "29790",
             "--out", str(out), "-o", str(script)]  # fmt: skip
    subprocess.run(write, check=True, cwd=out)
    (out / "COMMAND.txt").write_text(
        f"{shlex.join(['zero-kit', *write[1:]])}\nsbatch --wait {script.name}   # on a two-node Slurm 22.05 rig\n"
    )
    build_cpu_ops(timeout=900)
    with slurm_cluster("zkbr", subnet=58) as cluster:
        done = cluster.sbatch_wait(script, timeout=3000, cwd=out)
    print(done.stdout, done.stderr, (out / "table.md").read_text() if (out / "table.md").is_file() else "")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

"""The whole comparison as one multi-node job, for real on two hosts (network namespaces, root):

- `zero-kit bench --hostfile H` on the first of two sshd hosts: ZeRO through the deepspeed launcher over pdsh,
  DDP/FSDP2 through torchrun on each host over ssh;
- `zero-kit bench --slurm -o bench.sbatch` submitted with `sbatch --wait` to the two-node Slurm rig: one
  allocation, one srun per strategy.

Each leaves ONE complete results directory (results.jsonl, table.md, plots) whose records say 2 nodes x 1 rank
and how they were launched, with losses equal to a single-node two-rank DDP run within 1e-5 (fp32) and the bytes
that crossed the inter-node link counted by tier. Prefixes zkbp (pdsh, 10.78.53.x), zkbs (Slurm, 10.78.54.x).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from bench_reference import size_flags

from tests.rigs import slurm_cluster, ssh_hosts, write_hostfile
from tests.support.jobs import zero_kit
from tests.support.rigs import rig_marks

pytestmark = rig_marks()
SIZE = [*size_flags(), "--timeout", "300"]
# One strategy per launch path: ZeRO through the deepspeed launcher (pdsh) or srun, DDP through torchrun (ssh) or srun.
# FSDP2 across the two hosts is test_two_hosts.py's; its single-node reference is trained once for both files.
STRATEGIES = "ddp,zero3"


def _check_results(out: Path, mode: str, single_node: dict[str, list[float]]) -> None:
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["strategy"] for r in records] == STRATEGIES.split(","), records
    assert (out / "table.md").is_file() and {"loss.png", "memory.png", "throughput.png"} <= {
        p.name for p in out.glob("*.png")
    }
    for r in records:
        assert not r.get("failed"), r.get("log_tail")
        assert (r["nnodes"], r["ranks_per_node"], r["world_size"]) == (2, 1, 2)
        assert r["launch"] == {"mode": mode, "nodes": 2, "ranks_per_node": 1}
        diffs = [abs(a - b) for a, b in zip(r["losses"], single_node["ddp"], strict=True)]
        assert max(diffs) <= 1e-5, (r["strategy"], diffs)
        tiers = r["comm_bytes_per_step"]["ring_bytes_sent_all_ranks_by_tier"]
        # One rank per host: every ring link crosses the hosts, so every byte is inter-node.
        assert tiers["inter_node"] > 0 and tiers["intra_node"] == 0, tiers
        sent = r["comm_bytes_per_step"]["ring_bytes_sent_per_rank"]
        assert tiers["inter_node"] == pytest.approx(2 * sent, rel=1e-6)


def test_bench_hostfile_runs_each_launch_path_across_two_ssh_hosts(tmp_path, single_node):
    out = tmp_path / "bench"
    with ssh_hosts("zkbp", subnet=53) as rig:
        hostfile = write_hostfile(tmp_path / "hostfile", rig.hosts.names)
        argv = [*zero_kit("bench"), "--hostfile", str(hostfile), "--strategies", STRATEGIES,
                "--master-port", "29882", "--out", str(out), *SIZE]  # fmt: skip
        done = rig.run(argv, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _check_results(out, "hostfile", single_node)


def test_bench_slurm_sbatch_runs_its_strategies_in_one_allocation(tmp_path, single_node):
    out, script = tmp_path / "bench", tmp_path / "bench.sbatch"
    write = [*zero_kit("bench"), "--slurm", "--nodes", "2", "--gpus-per-node", "1",
             "--strategies", STRATEGIES, "--master-port", "29885", "--out", str(out), "-o", str(script), *SIZE]  # fmt: skip
    assert subprocess.run(write, capture_output=True, text=True, timeout=60, cwd=tmp_path).returncode == 0
    with slurm_cluster("zkbs", subnet=54) as cluster:
        done = cluster.sbatch_wait(script, timeout=900, cwd=tmp_path)
    logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert done.returncode == 0, logs[-4000:]
    _check_results(out, "slurm", single_node)

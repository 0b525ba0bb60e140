"""`zero-kit train` through the cluster launch paths, for real on two hosts (network namespaces, root):

- SLURM: `zero-kit launch --slurm -- train ...` writes the sbatch script; `sbatch --wait` on the two-node Slurm
  rig trains ZeRO-3 (deepspeed launcher, --no_ssh per node) and ZeRO-2 (torchrun per node) across both nodes
  and exports a Hugging Face directory;
- pdsh/ssh: `zero-kit train --hostfile H` on the first host starts a rank on each host through DeepSpeed's
  default launcher, trains ZeRO-3 and exports;
- a rank failing on the remote node (exit 3) comes back as the job's exit code in both paths.

Prefixes zkcs (Slurm, 10.78.51.x) and zkcp (pdsh, 10.78.52.x). Ports 29870-29879.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.rigs import slurm_cluster, ssh_hosts, write_hostfile
from benchmarks.rigs.base import rig_env
from tests.support.jobs import FAULTS_SITE, VENV, pythonpath_with, run, zero_kit
from tests.support.rigs import rig_marks
from tests.support.runs import assert_trained

pytestmark = rig_marks()
STEPS = 3
JOB = ["--max-steps", str(STEPS), "--max-length", "64", "--micro-batch", "2", "--stall-timeout", "60"]


def _zero_kit(*args: str, cwd: Path) -> None:
    run(zero_kit(*args), timeout=60, cwd=cwd)


def _assert_trained_and_exported(out: Path, stage: int) -> None:
    assert_trained(out, STEPS, world_size=2, stage=stage)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "final")
    assert all(t.numel() > 0 for t in model.state_dict().values())


def _fault_env(code: int) -> dict[str, str]:
    path = pythonpath_with(FAULTS_SITE)
    return rig_env(PYTHONPATH=path, ZERO_KIT_FAULT_EXIT_RANK="1", ZERO_KIT_FAULT_EXIT_CODE=str(code))


@pytest.mark.parametrize(("launcher", "stage", "port"), [("deepspeed", 3, 29870), ("torchrun", 2, 29871)])
def test_slurm_sbatch_trains_across_two_nodes_and_exports(tmp_path, cpu_ops, launcher, stage, port):
    script = tmp_path / "train.sbatch"
    _zero_kit("launch", "--slurm", "--nodes", "2", "--gpus-per-node", "1", "--launcher", launcher,
              "--master-port", str(port), "--venv", str(VENV), "--time", "00:10:00", "-o", str(script),
              "--", "train", "--stage", str(stage), "--output", str(tmp_path / "run"), *JOB, cwd=tmp_path)  # fmt: skip
    with slurm_cluster("zkcs", subnet=51) as cluster:
        done = cluster.sbatch_wait(script, timeout=420, cwd=tmp_path)
        logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
        assert done.returncode == 0, done.stdout + done.stderr + logs[-4000:]
    _assert_trained_and_exported(tmp_path / "run", stage)


def test_slurm_job_exit_code_is_the_remote_ranks(tmp_path, cpu_ops):
    script = tmp_path / "train.sbatch"
    _zero_kit("launch", "--slurm", "--nodes", "2", "--gpus-per-node", "1", "--master-port", "29872",
              "--venv", str(VENV), "-o", str(script), "--", "train", "--stage", "3", "--no-export",
              "--output", str(tmp_path / "run"), *JOB, cwd=tmp_path)  # fmt: skip
    with slurm_cluster("zkcs", subnet=51) as cluster:
        done = cluster.sbatch_wait(script, timeout=420, cwd=tmp_path, env=_fault_env(3))
    logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert "[fault] rank 1 exits 3" in logs, logs[-4000:]
    assert done.returncode == 3, logs[-4000:]


def _pdsh_train(rig, tmp_path: Path, port: int, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    hostfile = write_hostfile(tmp_path / "hostfile", rig.hosts.names)
    argv = [*zero_kit("train"), "--hostfile", str(hostfile), "--master-port", str(port),
            "--stage", "3", "--output", str(tmp_path / "run"), *JOB, *extra]  # fmt: skip
    return rig.run(argv, cwd=tmp_path, timeout=420, env=env or rig_env())


def test_hostfile_launch_trains_on_both_hosts_over_pdsh_and_exports(tmp_path, cpu_ops):
    with ssh_hosts("zkcp", subnet=52) as rig:
        done = _pdsh_train(rig, tmp_path, 29873)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "zkcp1: " in log, "the second host ran no rank"
    env_file = (tmp_path / "run" / ".deepspeed_env").read_text()
    assert "TORCH_EXTENSIONS_DIR=" in env_file and "\n\n" not in env_file and "GLOO_SOCKET_IFNAME" not in env_file
    _assert_trained_and_exported(tmp_path / "run", 3)


def test_hostfile_launch_exit_code_is_the_remote_ranks(tmp_path, cpu_ops):
    with ssh_hosts("zkcp", subnet=52) as rig:
        done = _pdsh_train(rig, tmp_path, 29874, "--no-export", env=_fault_env(3))
    log = done.stdout + done.stderr
    assert "[fault] rank 1 exits 3" in log, log[-4000:]
    assert done.returncode == 3, log[-4000:]

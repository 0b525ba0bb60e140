"""The project's own rigs (tests/rigs) run for real: a two-node Slurm 22.05 cluster, two sshd hosts driven by
DeepSpeed's default pdsh launcher, and two network-namespace hosts whose link is cut and restored. Each rig must
leave nothing behind (namespaces, daemons, /etc/netns entries, its /tmp folder), also when the body fails.

Prefixes zkrs (Slurm, 10.78.41.x), zkrp (pdsh, 10.78.42.x), zkrn (netns, 10.78.45.x), zkrf* (failing bodies,
10.78.46-48.x). Root only; CI runs as root, where a skip counts as a failure.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.rigs import (
    RigError,
    reachable,
    require,
    set_link,
    set_rate,
    slurm_cluster,
    ssh_hosts,
    two_hosts,
    write_deepspeed_env,
    write_hostfile,
)
from tests.rigs.base import is_alive, rig_env, wait_until
from tests.rigs.pdsh import deepspeed_env_defaults
from tests.support.rigs import namespaces, rig_marks

pytestmark = rig_marks()

ALL_REDUCE = """
import os, socket, sys
import deepspeed, torch
import torch.distributed as dist

deepspeed.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"RESULT rank={rank} host={socket.gethostname()} sum={total.item():.0f}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(int(os.environ.get("ZK_EXIT_ON_RANK1", "0")) if rank == 1 else 0)
"""


def _rig_pids(root: Path) -> list[int]:
    return [int(path.read_text().split()[0]) for path in root.glob("*.pid")]


def _assert_gone(prefix: str, root: Path | None = None, pids: list[int] = ()) -> None:
    assert not [ns for ns in namespaces() if ns.startswith(prefix)], namespaces()
    assert not list(Path("/etc/netns").glob(f"{prefix}*")) if Path("/etc/netns").exists() else True
    assert root is None or not root.exists()
    assert not [pid for pid in pids if is_alive(pid)], "a rig daemon outlived the rig"


def _timed(label: str, start: float) -> None:
    print(f"\n[rig timing] {label}: {time.monotonic() - start:.2f} s")


def _sbatch(path: Path, body: str, *options: str) -> Path:
    header = "".join(f"#SBATCH {option}\n" for option in ("--nodes=2", "--ntasks-per-node=1", *options))
    path.write_text(f"#!/bin/bash\n{header}{textwrap.dedent(body)}", encoding="utf-8")
    return path


def test_slurm_two_node_job_sees_both_hosts_and_fake_gpus(tmp_path):
    start = time.monotonic()
    with slurm_cluster("zkrs", subnet=41) as cluster:
        _timed("slurm up", start)
        pids = _rig_pids(cluster.root)
        assert len(pids) == 4  # munged, slurmctld, two slurmd
        out = tmp_path / "hello.out"
        script = _sbatch(tmp_path / "hello.sbatch", "srun bash -c 'echo $(hostname) $(hostname -I) gpu=$CUDA_VISIBLE_DEVICES'\n",
                         "--gpus-per-node=1", f"--output={out}")  # fmt: skip
        job_start = time.monotonic()
        done = cluster.sbatch_wait(script, timeout=60)
        _timed("slurm 2-node hello job (sbatch --wait)", job_start)
        assert done.returncode == 0, done.stderr + cluster.squeue()
        lines = sorted(out.read_text().split("\n")[:2])
        assert lines == ["zkrs0 10.78.41.1 gpu=0", "zkrs1 10.78.41.2 gpu=0"], out.read_text()
        srun = cluster.srun(["bash", "-c", "echo $(hostname) $(hostname -I)"], timeout=60)
        assert sorted(srun.stdout.split("\n")[:2]) == ["zkrs0 10.78.41.1", "zkrs1 10.78.41.2"], srun.stderr
        start = time.monotonic()
    _timed("slurm down", start)
    _assert_gone("zkrs", cluster.root, pids)


def test_slurm_task_exit_code_comes_back_from_sbatch_wait(tmp_path):
    with slurm_cluster("zkrs", subnet=41) as cluster:
        body = "srun bash -c 'if [ $SLURM_NODEID = 1 ]; then exit 3; fi'\n"
        script = _sbatch(tmp_path / "fail.sbatch", body, f"--output={tmp_path}/fail.out")
        done = cluster.sbatch_wait(script, timeout=60)
        assert done.returncode == 3, done.stdout + done.stderr
        pids = _rig_pids(cluster.root)
    _assert_gone("zkrs", cluster.root, pids)


def test_slurm_down_with_a_job_still_running_and_a_timed_out_wait(tmp_path):
    """The body times out on `sbatch --wait` while the job sleeps: teardown still removes every step and daemon."""
    script = _sbatch(tmp_path / "sleep.sbatch", "srun sleep 300\n", f"--output={tmp_path}/sleep.out")
    with pytest.raises(subprocess.TimeoutExpired), slurm_cluster("zkrs", subnet=41) as cluster:
        pids = _rig_pids(cluster.root)
        try:
            cluster.sbatch_wait(script, timeout=4)
        finally:
            assert "RUNNING" in cluster.squeue()
            start = time.monotonic()
    _timed("slurm down with a running job", start)
    _assert_gone("zkrs", cluster.root, pids)


def _deepspeed(rig, launch_dir: Path, port: int, timeout: float = 180) -> subprocess.CompletedProcess:
    argv = ["deepspeed", "--hostfile", "hostfile", "--master_addr", rig.hosts.addresses[0], "--master_port",
            str(port), "all_reduce.py"]  # fmt: skip
    try:
        return rig.run(argv, cwd=launch_dir, timeout=timeout, env=rig_env(PYTHONUNBUFFERED="1"))
    except subprocess.TimeoutExpired as exc:  # show what the ranks were doing (the rig's teardown kills them)
        pytest.fail(f"deepspeed launcher timed out after {timeout} s:\n{(exc.output or '')[-4000:]}{exc.stderr or ''}")


def _launch_dir(tmp_path: Path, names, env: dict[str, str] | None = None) -> Path:
    (tmp_path / "all_reduce.py").write_text(ALL_REDUCE, encoding="utf-8")
    write_hostfile(tmp_path / "hostfile", names)
    write_deepspeed_env(tmp_path, env)
    return tmp_path


def test_deepspeed_pdsh_launcher_all_reduces_across_two_ssh_hosts(tmp_path, cpu_ops):
    start = time.monotonic()
    with ssh_hosts("zkrp", subnet=42) as rig:
        _timed("ssh up", start)
        pids = _rig_pids(rig.root)
        assert rig.ssh(1, "hostname").stdout.strip() == "zkrp1"
        launch_dir = _launch_dir(tmp_path, rig.hosts.names)
        start = time.monotonic()
        done = _deepspeed(rig, launch_dir, port=29561)
        _timed("deepspeed pdsh all_reduce", start)
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-4000:]
        assert "zkrp0: RESULT rank=0 host=zkrp0 sum=3" in log and "zkrp1: RESULT rank=1 host=zkrp1 sum=3" in log, log
        start = time.monotonic()
    _timed("ssh down", start)
    _assert_gone("zkrp", rig.root, pids)


def test_remote_rank_exit_code_comes_back_through_pdsh(tmp_path, cpu_ops):
    with ssh_hosts("zkrp", subnet=42) as rig:
        pids = _rig_pids(rig.root)
        launch_dir = _launch_dir(tmp_path, rig.hosts.names, {**deepspeed_env_defaults(), "ZK_EXIT_ON_RANK1": "3"})
        done = _deepspeed(rig, launch_dir, port=29562)
        log = done.stdout + done.stderr
        assert "zkrp1: RESULT rank=1" in log, log[-4000:]  # the remote rank ran, then left with 3
        assert done.returncode == 3, log[-4000:]
    _assert_gone("zkrp", rig.root, pids)


def test_deepspeed_env_refuses_blank_values_and_gloo_ifname(tmp_path):
    with pytest.raises(RigError, match="GLOO_SOCKET_IFNAME"):
        write_deepspeed_env(tmp_path, {"GLOO_SOCKET_IFNAME": "zkrp0v"})
    with pytest.raises(RigError, match="blank"):
        write_deepspeed_env(tmp_path, {"A": ""})
    text = write_deepspeed_env(tmp_path).read_text()
    assert "TORCH_EXTENSIONS_DIR=" in text and "\n\n" not in text and text.endswith("\n")


def test_netns_link_cut_and_restore():
    with two_hosts("zkrn", subnet=45) as hosts:
        assert reachable(hosts, 0, 1) and reachable(hosts, 1, 0)
        set_link(hosts, 0, up=False)
        assert not reachable(hosts, 0, 1) and not reachable(hosts, 1, 0)
        set_link(hosts, 0, up=True)
        wait_until(lambda: reachable(hosts, 0, 1), 10, "restored link")  # the carrier comes back within ~1 s
        assert reachable(hosts, 1, 0)
        set_rate(hosts, 1, "200mbit")
        qdisc = subprocess.run(hosts.exec(1, "tc", "qdisc", "show", "dev", hosts.device(1)), capture_output=True,
                               text=True, timeout=30).stdout  # fmt: skip
        assert "tbf" in qdisc and "200Mbit" in qdisc
    _assert_gone("zkrn")


@pytest.mark.parametrize("rig", ["netns", "slurm", "ssh"])
def test_rig_is_removed_when_the_body_raises(rig):
    prefix, subnet = {"netns": ("zkrfn", 46), "slurm": ("zkrfs", 47), "ssh": ("zkrfp", 48)}[rig]
    make = {"netns": two_hosts, "slurm": slurm_cluster, "ssh": ssh_hosts}[rig]
    leftover = subprocess.Popen  # a process the body leaves running inside a namespace must die with the rig
    with pytest.raises(RuntimeError, match="boom"), make(prefix, subnet) as up:
        hosts = getattr(up, "hosts", up)
        root = getattr(up, "root", None)
        pids = _rig_pids(root) if root else []
        sleeper = leftover(hosts.exec(1, "sleep", "300"))
        wait_until(lambda: sleeper.pid in map(int, _ns_pids(hosts.names[1])), 10, "sleeper in namespace")
        raise RuntimeError("boom")
    assert sleeper.wait(timeout=10) == -9
    _assert_gone(prefix, root, pids)


def _ns_pids(namespace: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30).stdout.split()


def test_missing_binary_is_a_clear_error_with_the_apt_line():
    with pytest.raises(RigError, match=r"missing no-such-slurmd .*apt-get install -y slurmd slurmctld"):
        require("no-such-slurmd")
    cli = subprocess.run([sys.executable, "-m", "tests.rigs", "slurm", "up", "Bad_Prefix"], capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert cli.returncode == 1 and cli.stderr.startswith("error: prefix") and "Traceback" not in cli.stderr

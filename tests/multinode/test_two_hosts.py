"""A real two-node job on this machine: two network-namespace hosts (zkb10 / zkb11, 10.78.1.1 / .2) joined by a
veth pair, gloo over real TCP, one rank per host, each host running its own launcher (deepspeed --no_ssh for
zero3, torchrun --nnodes 2 for fsdp). Losses must match a single-node two-rank run (bench_reference.py, trained
once per test run). Ports 29730-29739."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

import pytest
from bench_reference import SIZE

from tests.rigs.two_host_bench import run_two_hosts, two_hosts
from zero_kit.bench import BenchOptions

pytestmark = pytest.mark.multinode
PREFIX = "zkb1"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2"
)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@needs_root
def test_zero3_and_fsdp_across_two_hosts_match_the_single_node_run(tmp_path, single_node):
    """Against the one-host two-rank DDP run at the same size (bench_reference.py, shared with test_cluster_bench)."""
    opts = BenchOptions(nproc=1, master_port=29730, timeout=240, out=str(tmp_path / "single"), **SIZE)
    try:
        with two_hosts(PREFIX, subnet=1) as hosts:
            assert f"{PREFIX}0" in _namespaces()
            addr = subprocess.run(["ip", "-n", hosts.names[1], "addr"], capture_output=True, text=True).stdout
            assert hosts.addresses[1] in addr  # each host sees only its own address; traffic crosses the veth
            for index, strategy in enumerate(("zero3", "fsdp")):
                run_opts = dataclasses.replace(opts, master_port=29732 + index)
                record = run_two_hosts(strategy, run_opts, hosts, tmp_path / "two_hosts")
                logs = sorted((tmp_path / "two_hosts").glob(f"{strategy}.node*.log"))
                assert record is not None, "\n".join(p.read_text()[-2000:] for p in logs)
                assert record["world_size"] == 2 and record["nnodes"] == 2
                assert "GLOO_SOCKET_IFNAME=zkb10v" in logs[0].read_text().splitlines()[0]
                diff = max(abs(a - b) for a, b in zip(record["losses"], single_node["ddp"], strict=True))
                assert diff <= 1e-5, f"{strategy} on two hosts differs from one node by {diff}"
                assert record["comm_bytes_per_step"]["ring_bytes_sent_per_rank"] > 0
    finally:
        assert f"{PREFIX}0" not in _namespaces() and f"{PREFIX}1" not in _namespaces()


@needs_root
def test_namespaces_are_removed_when_the_body_fails():
    with pytest.raises(RuntimeError), two_hosts(PREFIX + "f", subnet=9):
        assert f"{PREFIX}f0" in _namespaces()
        raise RuntimeError("boom")
    assert f"{PREFIX}f0" not in _namespaces()

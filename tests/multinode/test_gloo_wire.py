"""What gloo really sends over the inter-node link, per collective, on the two-host rig (namespaces zkgw0 / zkgw1,
10.78.79.1 / .2, two ranks each, the veth uncapped): the kernel's tx counter of each host's veth around three calls
of an 8 MiB all-reduce, all-gather and reduce-scatter (benchmarks/link_cap/probe.py --wire).

The step-time model (zero_kit.plan.timing) rests on these facts: all-reduce and all-gather send the ring model's
bytes over each host's link; a reduce-scatter sends an all-reduce's (ProcessGroupGloo clones the input, all-reduces
it and keeps its chunk), twice the ring reduce-scatter NCCL runs. If a torch release gave gloo a real
reduce-scatter, this test fails and `--comm-backend gloo` must change with it.

Port 29941 inside the namespaces; they are removed when the fixture ends, also on failure or timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from benchmarks.link_cap.run import probe_two_hosts
from tests.rigs.base import remove_etc_netns
from tests.rigs.netns import hosts_for, two_hosts
from zero_kit.plan.timing import on_the_wire
from zero_kit.plan.traffic import Collective

pytestmark = [
    pytest.mark.multinode,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="the rig needs root and iproute2"),
]
PREFIX, SUBNET = "zkgw", 79
FRAMING = 0.08  # Ethernet/IP/TCP headers and gloo's own messages on top of the payload


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    log = tmp_path_factory.mktemp("gloo_wire") / "wire.log"
    try:
        with two_hosts(PREFIX, SUBNET) as hosts:
            found = probe_two_hosts(hosts, 29941, log, nproc=2, wire=True)
    finally:
        remove_etc_netns(hosts_for(PREFIX, SUBNET).names)
    assert found["hosts"] == 2 and found["world_size"] == 4
    return found["kinds"]


@pytest.mark.parametrize("kind", ["allreduce", "allgather"])
def test_ring_collectives_send_the_ring_bytes(wire, kind):
    ring = wire[kind]["ring_bytes_per_call_per_host"]
    assert len(wire[kind]["wire_bytes_per_call_by_host"]) == 2
    for sent in wire[kind]["wire_bytes_per_call_by_host"]:
        assert ring <= sent <= ring * (1 + FRAMING), (kind, sent, ring)


def test_reduce_scatter_sends_an_all_reduce(wire):
    reduce_scatter, allreduce = wire["reducescatter"], wire["allreduce"]
    for sent, as_allreduce in zip(
        reduce_scatter["wire_bytes_per_call_by_host"], allreduce["wire_bytes_per_call_by_host"], strict=True
    ):
        assert sent == pytest.approx(as_allreduce, rel=0.03)
        assert sent > 1.8 * reduce_scatter["ring_bytes_per_call_per_host"]  # not the ring reduce-scatter
    gloo = on_the_wire(Collective("grads", "reducescatter", 1, 1, True), "gloo")
    assert gloo.kind == "allreduce"  # what the planner charges with --comm-backend gloo


def test_the_rig_is_gone():
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{PREFIX}0" not in listed and f"{PREFIX}1" not in listed
    assert not any(os.path.exists(f"/etc/netns/{PREFIX}{node}") for node in (0, 1))

"""A bench run's rendezvous port (zero_kit.bench.driver._rendezvous_port): on one host a port something else holds
is passed over for a free one, said on the progress line; on several nodes the given port stays, since every node
was given it. The whole bench with its first port held: tests/dist/test_bench_compare.py."""

from __future__ import annotations

from tests.support.jobs import held_port
from zero_kit.bench.driver import _rendezvous_port
from zero_kit.dist import port_in_use
from zero_kit.launch import Placement, local


def test_a_taken_port_on_one_host_is_passed_over_and_said():
    lines = []
    with held_port() as taken:
        assert port_in_use(taken)
        port = _rendezvous_port(taken, local(2), "ddp", lines.append)
        assert port != taken and not port_in_use(port)
    assert lines == [f"port {taken} is in use on this host: ddp meets on port {port} instead"]


def test_a_free_port_and_a_multi_node_port_are_kept():
    lines = []
    with held_port() as free:
        pass
    assert _rendezvous_port(free, local(2), "zero1", lines.append) == free
    with held_port() as taken:
        nodes = Placement("hostfile", ("node0", "node1"), 1, hostfile="hosts")
        assert _rendezvous_port(taken, nodes, "zero1", lines.append) == taken
    assert lines == []

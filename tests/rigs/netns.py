"""Two real hosts on one machine: network namespaces PREFIX0 / PREFIX1 at 10.78.SUBNET.1 / .2, joined by a veth
pair (PREFIX0v <-> PREFIX1v). Optionally each host's egress is capped by a token bucket (`tc tbf`; netem is not
available here) to emulate a slow inter-node link, and the link can be cut and restored for fault tests.

Same API as zero_kit.bench_netns.two_hosts (plus `hosts.exec`, `set_link`, `set_rate`, `reachable`). Root and
iproute2 needed. A separate prefix and subnet per caller keeps parallel tests apart.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from tests.rigs.base import RigError, check_prefix, kill_namespace_processes, require, run, sigterm_raises


@dataclass(frozen=True)
class TwoHosts:
    names: tuple[str, str]
    addresses: tuple[str, str]

    def device(self, node: int) -> str:
        return f"{self.names[node]}v"

    def exec(self, node: int, *argv: str) -> list[str]:
        """argv that runs `argv` on host `node`."""
        return ["ip", "netns", "exec", self.names[node], *argv]


def hosts_for(prefix: str, subnet: int) -> TwoHosts:
    if not 0 <= subnet <= 255:
        raise RigError(f"subnet {subnet}: use 0-255 (addresses 10.78.SUBNET.1 and .2)")
    check_prefix(prefix)
    return TwoHosts((f"{prefix}0", f"{prefix}1"), (f"10.78.{subnet}.1", f"10.78.{subnet}.2"))


def _ip(*args: str) -> None:
    run(["ip", *args])


def make_hosts(prefix: str, subnet: int, rate: str | None = None) -> TwoHosts:
    """Build the two hosts (removing leftovers of a killed earlier run first). `rate`, e.g. "200mbit", caps egress."""
    require("ip", "tc") if rate else require("ip")
    hosts = hosts_for(prefix, subnet)
    remove_hosts(prefix)
    for name in hosts.names:
        _ip("netns", "add", name)
    _ip("link", "add", hosts.device(0), "type", "veth", "peer", "name", hosts.device(1))
    for node, name in enumerate(hosts.names):
        _ip("link", "set", hosts.device(node), "netns", name)
        _ip("-n", name, "addr", "add", f"{hosts.addresses[node]}/24", "dev", hosts.device(node))
        _ip("-n", name, "link", "set", hosts.device(node), "up")
        _ip("-n", name, "link", "set", "lo", "up")
        if rate:
            set_rate(hosts, node, rate)
    return hosts


def remove_hosts(prefix: str) -> None:
    """Kill everything left in the namespaces, then delete them (deleting one end removes the veth pair)."""
    names = [f"{prefix}0", f"{prefix}1"]
    kill_namespace_processes(names)
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@contextlib.contextmanager
def two_hosts(prefix: str, subnet: int, rate: str | None = None) -> Iterator[TwoHosts]:
    """Namespaces PREFIX0 / PREFIX1 at 10.78.SUBNET.1 / .2; always removed on exit, also when the body fails."""
    with sigterm_raises():
        try:
            yield make_hosts(prefix, subnet, rate)
        finally:
            remove_hosts(prefix)


def set_link(hosts: TwoHosts, node: int, up: bool) -> None:
    """Cut (up=False) or restore node's end of the veth. Either end down drops the carrier on both: the pair is
    cut. On restore the kernel re-adds the /24 route, so traffic flows again without re-adding addresses."""
    _ip("-n", hosts.names[node], "link", "set", hosts.device(node), "up" if up else "down")


def set_rate(hosts: TwoHosts, node: int, rate: str | None) -> None:
    """Cap node's egress at `rate` (tc tbf, e.g. "200mbit"); None removes the cap."""
    tc = ["ip", "netns", "exec", hosts.names[node], "tc", "qdisc"]
    if rate is None:
        run([*tc, "del", "dev", hosts.device(node), "root"], check=False)
        return
    run([*tc, "replace", "dev", hosts.device(node), "root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"])


_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except ConnectionRefusedError:
    pass  # a refusal is an answer from the other host: reachable
except OSError:
    sys.exit(1)
"""


def reachable(hosts: TwoHosts, src: int, dst: int, port: int = 9, timeout: float = 1.0) -> bool:
    """Whether host `src` gets a TCP answer (accept or refusal) from host `dst` within `timeout` seconds.
    No listener needed, and no ping binary (iputils-ping is not installed here)."""
    argv = hosts.exec(src, sys.executable, "-c", _PROBE, hosts.addresses[dst], str(port), str(timeout))
    return subprocess.run(argv, capture_output=True, timeout=timeout + 20).returncode == 0


def remove_daemon_rig(prefix: str, root, pid_files) -> None:
    """Tear down a rig of daemons on the two hosts (sshd, Slurm): stop the daemons by PID file, kill everything left
    in the namespaces, delete the namespaces, the rig's folder `root` and /etc/netns/PREFIX0, PREFIX1. Every step
    runs even when an earlier one fails; safe to call when nothing is up."""
    import shutil

    from tests.rigs.base import remove_etc_netns, stop_daemons, teardown

    teardown(
        lambda: stop_daemons(pid_files),
        lambda: remove_hosts(prefix),  # kills what is left in the namespaces first
        lambda: remove_etc_netns(hosts_for(prefix, 0).names),
        lambda: shutil.rmtree(root, ignore_errors=True),
    )

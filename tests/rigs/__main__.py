"""Bring a rig up or down by hand, for benchmarks and debugging (root). From the repository root:

    python -m tests.rigs slurm up zkx --subnet 60     # nodes zkx0 / zkx1, 10.78.60.1 / .2
    ip netns exec zkx0 env SLURM_CONF=/tmp/zkx-slurm/slurm.conf sinfo
    python -m tests.rigs slurm down zkx
    python -m tests.rigs ssh up zkx --subnet 61        # sshd hosts for `deepspeed --hostfile`
    python -m tests.rigs netns up zkx --subnet 62 --rate 200mbit
    python -m tests.rigs apt                           # the apt-get line the rigs need

`up` first clears what an earlier run of the same prefix left; daemons keep running after this command exits.
"""

from __future__ import annotations

import argparse
import sys

from tests.rigs import netns, pdsh, slurm
from tests.rigs.base import RigError, apt_line


def _up(kind: str, prefix: str, subnet: int, rate: str | None) -> str:
    if kind == "netns":
        hosts = netns.make_hosts(prefix, subnet, rate)
        return f"hosts {hosts.names} at {hosts.addresses}; run with: ip netns exec {hosts.names[0]} COMMAND"
    if kind == "ssh":
        rig = pdsh.ssh_up(prefix, subnet)
        return (f"sshd hosts {rig.hosts.names} at {rig.hosts.addresses}, files in {rig.root}; launch inside host 0:"
                f"\n  ip netns exec {rig.hosts.names[0]} deepspeed --hostfile H --master_addr "
                f"{rig.hosts.addresses[0]} script.py   (.deepspeed_env: TORCH_EXTENSIONS_DIR=...)")  # fmt: skip
    cluster = slurm.slurm_up(prefix, subnet)
    return (
        f"slurm nodes {cluster.hosts.names} at {cluster.hosts.addresses}, files in {cluster.root}; submit with:"
        f"\n  ip netns exec {cluster.hosts.names[0]} env SLURM_CONF={cluster.conf} sbatch --wait job.sbatch"
    )


def _down(kind: str, prefix: str) -> None:
    {"netns": netns.remove_hosts, "ssh": pdsh.ssh_down, "slurm": slurm.slurm_down}[kind](prefix)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.rigs", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["netns", "ssh", "slurm", "apt"])
    parser.add_argument("action", nargs="?", choices=["up", "down"])
    parser.add_argument("prefix", nargs="?", help="namespace prefix, at most 13 characters (hosts PREFIX0, PREFIX1)")
    parser.add_argument("--subnet", type=int, default=77, help="addresses 10.78.SUBNET.1 and .2")
    parser.add_argument("--rate", help="netns only: cap each host's egress, e.g. 200mbit")
    args = parser.parse_args(argv)
    if args.kind == "apt":
        print(apt_line())
        return 0
    if not args.action or not args.prefix:
        parser.error("give up|down and a PREFIX")
    try:
        if args.action == "up":
            print(_up(args.kind, args.prefix, args.subnet, args.rate))
        else:
            _down(args.kind, args.prefix)
    except RigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Two real hosts on one machine for multi-node benchmark runs: two network namespaces joined by a veth pair
(root and iproute2 needed), optionally with each host's sending rate capped by a token bucket (`tc tbf`) to
emulate commodity Ethernet. Each host runs its own launcher (`deepspeed --no_ssh --node_rank i`, or `torchrun
--nnodes 2 --node_rank i`), gloo talks over real TCP between the namespaces. The commands and their supervision
are zero_kit.launch's (a per-node placement whose prefix is `ip netns exec HOST env ...`).

Addresses are 10.78.<subnet>.1 and .2 (the shared recipe uses 10.77.0.x; a separate subnet per caller keeps
parallel tests apart). Namespaces are always removed on exit, also when the run fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

from tests.rigs.netns import TwoHosts, remove_hosts, two_hosts  # noqa: F401 (the rig, re-exported)
from zero_kit.bench.options import PROGRESS, BenchOptions
from zero_kit.bench.placement import rank_args
from zero_kit.launch import Launch, Launcher, Output, launch_commands, per_node, supervise


def node_prefix(hosts: TwoHosts, node: int) -> tuple[str, ...]:
    """What starts a command on host `node`: its namespace, gloo on its veth end."""
    env = ["env", f"GLOO_SOCKET_IFNAME={hosts.device(node)}", "OMP_NUM_THREADS=1", "HF_HUB_OFFLINE=1"]
    return tuple(hosts.exec(node, *env))


def two_host_launch(strategy: str, opts: BenchOptions, hosts: TwoHosts, log_dir: Path, record: str) -> Launch:
    """One strategy's launchers, `opts.nproc` ranks per host (the hostfile lists the hosts' addresses)."""
    from zero_kit.strategies import check_name

    where = per_node([(address, opts.nproc) for address in hosts.addresses], [node_prefix(hosts, n) for n in (0, 1)])
    return launch_commands("zero_kit.bench", rank_args(strategy, opts, record), where,
                           Launcher(check_name(strategy).launcher), port=opts.master_port, run_dir=log_dir)  # fmt: skip


def run_two_hosts(strategy: str, opts: BenchOptions, hosts: TwoHosts, log_dir: Path, progress=None) -> dict | None:
    """One strategy across the two hosts, `opts.nproc` ranks per host. Returns rank 0's record, or None."""
    log_dir.mkdir(parents=True, exist_ok=True)
    fd, record = tempfile.mkstemp(suffix=".jsonl", dir=log_dir)
    os.close(fd)
    launch = two_host_launch(strategy, opts, hosts, log_dir, record)
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(open(log_dir / f"{strategy}.node{n}.log", "w", encoding="utf-8")) for n in (0, 1)]
        for log, argv in zip(logs, launch.argvs, strict=True):
            log.write(" ".join(argv) + "\n")
            log.flush()
        outcome = supervise(launch, timeout=opts.timeout, output=Output(files=logs))
    outcome.reraise()
    lines = Path(record).read_text(encoding="utf-8").splitlines()
    os.unlink(record)
    if outcome.exit_code != 0 or not lines:
        return None
    result = json.loads(lines[-1])
    if progress:
        progress(f"{strategy} on 2 hosts: loss {result['losses'][-1]:.6f}, step {result['step_time_s']:.3f}s")
    return result


def _print(line: str) -> None:
    print(f"{PROGRESS} {line}", file=sys.stderr, flush=True)

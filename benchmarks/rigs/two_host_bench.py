"""Two real hosts on one machine for multi-node benchmark runs: two network namespaces joined by a veth pair
(root and iproute2 needed), optionally with each host's sending rate capped by a token bucket (`tc tbf`) to
emulate commodity Ethernet. Each host runs its own launcher (`deepspeed --no_ssh --node_rank i`, or `torchrun
--nnodes 2 --node_rank i`), gloo talks over real TCP between the namespaces.

Addresses are 10.78.<subnet>.1 and .2 (the shared recipe uses 10.77.0.x; a separate subnet per caller keeps
parallel tests apart). Namespaces are always removed on exit, also when the run fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.rigs.netns import TwoHosts, remove_hosts, two_hosts  # noqa: F401 (the rig, re-exported)
from zero_kit.bench.options import PROGRESS, BenchOptions


def node_command(strategy: str, opts: BenchOptions, hosts: TwoHosts, node: int, hostfile: str, record: str) -> list:
    from zero_kit.launch import deepspeed_command, torchrun_command
    from zero_kit.strategies import check_name

    args = ["--strategy", strategy, "--options-json", json.dumps(dataclasses.asdict(opts)), "--record", record]
    if check_name(strategy).launcher == "deepspeed":
        launch = deepspeed_command("zero_kit.bench", args, nproc=opts.nproc, master_port=opts.master_port,
                                   hostfile=hostfile, node_rank=node, master_addr=hosts.addresses[0])  # fmt: skip
    else:
        launch = torchrun_command("zero_kit.bench", args, nproc=opts.nproc, master_port=opts.master_port, nnodes=2,
                                  node_rank=node, master_addr=hosts.addresses[0])  # fmt: skip
    env = ["env", f"GLOO_SOCKET_IFNAME={hosts.device(node)}", "OMP_NUM_THREADS=1", "HF_HUB_OFFLINE=1"]
    return ["ip", "netns", "exec", hosts.names[node], *env, *launch]


def run_two_hosts(strategy: str, opts: BenchOptions, hosts: TwoHosts, log_dir: Path, progress=None) -> dict | None:
    """One strategy across the two hosts, `opts.nproc` ranks per host. Returns rank 0's record, or None."""
    from zero_kit.launch import hostfile_text

    log_dir.mkdir(parents=True, exist_ok=True)
    hostfile = log_dir / "hostfile"
    hostfile.write_text(hostfile_text(list(hosts.addresses), opts.nproc), encoding="utf-8")
    fd, record = tempfile.mkstemp(suffix=".jsonl", dir=log_dir)
    os.close(fd)
    procs = []
    try:
        for node in (1, 0):
            log = open(log_dir / f"{strategy}.node{node}.log", "w", encoding="utf-8")  # noqa: SIM115 (closed below)
            cmd = node_command(strategy, opts, hosts, node, str(hostfile), record)
            log.write(" ".join(cmd) + "\n")
            log.flush()
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
        codes = [proc.wait(timeout=opts.timeout) for proc, _ in procs]
    except subprocess.TimeoutExpired:
        codes = [1]
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            log.close()
    lines = Path(record).read_text(encoding="utf-8").splitlines()
    os.unlink(record)
    if any(codes) or not lines:
        return None
    result = json.loads(lines[-1])
    if progress:
        progress(f"{strategy} on 2 hosts: loss {result['losses'][-1]:.6f}, step {result['step_time_s']:.3f}s")
    return result


def _print(line: str) -> None:
    print(f"{PROGRESS} {line}", file=sys.stderr, flush=True)

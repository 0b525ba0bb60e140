"""Multi-node comparison with the inter-node link capped: every strategy runs across two network-namespace hosts
with two ranks each (gloo over real TCP: loopback inside a host, a veth pair between them), first uncapped, then
with each host's egress capped by a token bucket (tc tbf) at every --rates entry. Records the ring bytes per link
tier (counted and planned), the step time and the slowdown from the cap, and sets the planner's predicted step
time (zero_kit.plan.timing) beside it, with the link rates probed on the rig and the planner calibrated as
`zero-kit plan --calibrate` does from every strategy run first on one host with the same 4 ranks (the compute rate
from DDP, each strategy's overhead per step). At every rate it also counts what each gloo collective really sends
over the veth (benchmarks/link_cap/probe.py --wire). Needs root and iproute2. Run from the repository root:

    python -m benchmarks.link_cap.run --rates none,1gbit,200mbit --out benchmarks/link_cap/results

Root namespace ports 29956-29957; namespaces zkhb0 / zkhb1 (10.78.70.1 / .2) with ports 29960-29999; removed on
exit, also on failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.link_cap.report import predict_rows, write_report
from tests.rigs.base import private_extensions_dir
from tests.rigs.netns import TwoHosts, set_rate, two_hosts
from tests.rigs.two_host_bench import run_two_hosts
from zero_kit.bench import BenchOptions, run_bench
from zero_kit.bench.options import PROGRESS

STRATEGIES = "ddp,fsdp,fsdp_hsdp,fsdp_reshard_node,zero1,zero2,zero3,zero3_hpz,zero3_release,zero3_hpz_release"
PER_HOST = 2
ONE_HOST_PORT = 29956
TWO_HOST_PORT = 29960
PROBE = "benchmarks.link_cap.probe"


def _print(line: str) -> None:
    """Progress on stderr as the bench driver writes it, so that stdout keeps only the final table."""
    print(f"{PROGRESS} {line}", file=sys.stderr, flush=True)


def bench_options(out: Path, steps: int, **size) -> BenchOptions:
    """The benchmark's run: the tiny LLaMA, fp32, one micro batch per step (what the traffic model counts)."""
    return BenchOptions(nproc=PER_HOST, steps=steps, warmup=2, master_port=TWO_HOST_PORT, timeout=400, out=str(out),
                        **size)  # fmt: skip


def strategy_options(name: str, opts: BenchOptions) -> BenchOptions:
    """pp trains the same global batch in micro batches of micro / stages rows, accumulated stages times: m = 2 x
    stages micro batches per step. At m = stages (the run's own micro batch, no accumulation) torch's Schedule1F1B
    over DDP-wrapped stages fails its second step (reducer.cpp: "rebuilt parameter indices size is not same as
    original model parameters size", torch 2.13, 2 stages x 2 data-parallel ranks)."""
    from zero_kit.strategies import STRATEGIES

    stages = STRATEGIES[name].pipeline_stages
    if stages == 1:
        return opts
    return dataclasses.replace(opts, micro_batch=opts.micro_batch // stages, grad_accum=opts.grad_accum * stages)


def probe(argv_prefix: list[str], launch: list[str], log: Path) -> dict:
    """One run of benchmarks.link_cap.probe; `argv_prefix` puts it into a namespace (or not)."""
    fd, result = tempfile.mkstemp(suffix=".json", dir=log.parent)
    os.close(fd)
    with open(log, "w", encoding="utf-8") as f:
        done = subprocess.run([*argv_prefix, *launch, result], stdout=f, stderr=subprocess.STDOUT, timeout=300)
    text = Path(result).read_text(encoding="utf-8")
    os.unlink(result)
    if done.returncode or not text:
        raise RuntimeError(f"link probe failed (exit {done.returncode}); see {log}")
    return json.loads(text)


def probe_one_host(nproc: int, log: Path, port: int) -> dict:
    from zero_kit.launch import torchrun_command

    env = ["env", "OMP_NUM_THREADS=1"]
    return probe(env, torchrun_command(PROBE, [], nproc=nproc, master_port=port), log)


def probe_two_hosts(hosts: TwoHosts, port: int, log: Path, nproc: int = 1, wire: bool = False) -> dict:
    """`nproc` ranks per host (1: every byte crosses the veth, the inter-node rate at the current cap); with
    `wire`, the bytes each collective really sends over the veth (benchmarks.link_cap.probe --wire)."""
    from zero_kit.launch import torchrun_command

    procs = []
    for node in (1, 0):
        args = ["--wire", hosts.device(node)] if wire else []
        launch = torchrun_command(PROBE, args, nproc=nproc, master_port=port, nnodes=2,
                                  node_rank=node, master_addr=hosts.addresses[0])  # fmt: skip
        env = hosts.exec(node, "env", f"GLOO_SOCKET_IFNAME={hosts.device(node)}", "OMP_NUM_THREADS=1")
        if node == 1:
            sink = open(log.with_suffix(".node1.log"), "w", encoding="utf-8")  # noqa: SIM115 (closed below)
            procs.append((subprocess.Popen([*env, *launch, os.devnull], stdout=sink, stderr=subprocess.STDOUT), sink))
        else:
            try:
                return probe(env, launch, log)
            finally:
                for proc, sink in procs:
                    proc.wait(timeout=60)
                    sink.close()
    raise AssertionError("unreachable")


def wire_tx_bytes(hosts: TwoHosts) -> list[int]:
    """Bytes each host has sent over its veth end (the kernel's counter: what really crossed the link)."""
    out = []
    for node in (0, 1):
        path = f"/sys/class/net/{hosts.device(node)}/statistics/tx_bytes"
        out.append(int(subprocess.run(hosts.exec(node, "cat", path), capture_output=True, text=True).stdout))
    return out


def calibrate(opts: BenchOptions, out: Path, port: int = ONE_HOST_PORT, strategies: str = "ddp") -> dict:
    """`strategies` on one host with all 4 ranks (the compute rate and overheads under the same CPU sharing),
    counted as 2 simulated nodes of 2 (bench --gpus-per-node) so that every strategy forms the process groups of
    the two-host runs, and the loopback probe, on root-namespace ports `port` and `port + 1`."""
    one = dataclasses.replace(opts, strategies=strategies, nproc=2 * PER_HOST, gpus_per_node=PER_HOST,
                              master_port=port, out=str(out / "one_host"))  # fmt: skip
    _print(f"one host, 4 ranks: {strategies}")
    names = strategies.split(",")
    plain = [name for name in names if strategy_options(name, one) is one]
    records = run_bench(dataclasses.replace(one, strategies=",".join(plain)), progress=lambda line: None)
    for name in (name for name in names if name not in plain):  # its own batch split: its own bench run
        own = dataclasses.replace(strategy_options(name, one), strategies=name, out=str(out / "one_host" / name))
        records += run_bench(own, progress=lambda line: None)
    failed = [r for r in records if r.get("failed")]
    if failed:
        raise RuntimeError(f"one-host {failed[0]['strategy']} failed: {failed[0].get('log_tail')}")
    intra = probe_one_host(2 * PER_HOST, out / "logs" / "probe_one_host.log", port + 1)
    _print(f"loopback probe: {intra['bytes_per_s'] / 1e6:.0f} MB/s per rank, latency {intra['latency_s'] * 1e3:.2f} ms")
    found = {"ddp_one_host": next(r for r in records if r["strategy"] == "ddp"), "intra_probe": intra}
    return found | ({"one_host_all": records} if len(records) > 1 else {})


def run(strategies: list[str], rates: list[str], opts: BenchOptions, out: Path, prefix: str, subnet: int) -> dict:
    """Every strategy at every rate on one pair of hosts (the cap changes between rates, not the hosts)."""
    rows, probes, wires = [], {}, {}
    port = opts.master_port
    with two_hosts(prefix, subnet) as hosts:
        for rate in rates:
            for node in (0, 1):
                set_rate(hosts, node, None if rate == "none" else rate)
            probes[rate] = probe_two_hosts(hosts, port, out / "logs" / f"probe_{rate}.log")
            wires[rate] = probe_two_hosts(hosts, port + 1, out / "logs" / f"wire_{rate}.log", PER_HOST, wire=True)
            port += 2
            _print(f"veth probe at {rate}: {probes[rate]['bytes_per_s'] / 1e6:.1f} MB/s")
            for name in strategies:
                before = wire_tx_bytes(hosts)
                record = run_two_hosts(name, strategy_options(name, dataclasses.replace(opts, master_port=port)), hosts,
                                       out / "logs" / rate, _print)  # fmt: skip
                port += 1
                wire = [b - a for a, b in zip(before, wire_tx_bytes(hosts), strict=True)]
                rows.append({"strategy": name, "rate": rate, "record": record, "wire_tx_bytes_per_run": wire})
    return {"rows": rows, "inter_probes": probes, "wire": wires}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="none,1gbit,200mbit", help="tbf rate per host egress; none = uncapped")
    parser.add_argument("--strategies", default=STRATEGIES)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run, 2 of them warm-up")
    parser.add_argument("--out", default="benchmarks/link_cap/results")
    parser.add_argument("--size", default="", help="hidden,layers of the tiny model (default: its own)")
    args = parser.parse_args()
    os.environ["TORCH_EXTENSIONS_DIR"] = str(private_extensions_dir())  # the prebuilt CPU ops: no rebuild per run
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    size = dict(zip(("hidden_size", "layers"), map(int, args.size.split(",")), strict=True)) if args.size else {}
    opts = bench_options(out, args.steps, **size)
    command = ("python -m benchmarks.link_cap.run " + " ".join(sys.argv[1:])).strip()
    rates = args.rates.split(",")
    result = {**calibrate(opts, out, strategies=args.strategies), **run(args.strategies.split(","), rates, opts, out,
                                                                        "zkhb", 70)}  # fmt: skip
    result["commands"] = [command]
    predict_rows(result)
    text = write_report(result, list(dict.fromkeys(r["rate"] for r in result["rows"])), out)
    print(text)
    return 0 if all(r["record"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())

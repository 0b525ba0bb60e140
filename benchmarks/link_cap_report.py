"""Predictions, tables and plots of benchmarks/link_cap.py: the planner's step time (zero_kit.plan.timing) for
every run, with rates measured on the rig, next to the measured step time and the counted bytes per link tier.

Rates (all stated in table.md): compute = the FLOP/s per rank at which the planner reproduces the one-host 4-rank
DDP step (its loopback all-reduce subtracted at the probed loopback rate); intra-node = the loopback probe (4 ranks
on one host); inter-node = the veth probe uncapped, the tbf rate itself when capped (the rate per host egress);
latency = the probed 4-byte all-reduce; overlap 0: the 4 ranks share 2 CPU cores, so gloo's communication runs on
the same cores as the compute and hides nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from zero_kit.bench.report import annotate, predicted_comm, record_workload
from zero_kit.plan.memory import Hardware
from zero_kit.plan.rates import Rates
from zero_kit.plan.timing import compute_seconds, step_time
from zero_kit.strategies import STRATEGIES

TOLERANCE = 0.25
UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bytes_per_s(rate: str) -> float:
    unit = next(u for u in UNITS if rate.endswith(u))
    return float(rate[: -len(unit)]) * UNITS[unit] / 8


def rig_rates(flops_per_s: float, intra: dict, inter_bytes_per_s: float, source: str) -> Rates:
    return Rates(flops_per_s=flops_per_s, intra_bytes_per_s=intra["bytes_per_s"], inter_bytes_per_s=inter_bytes_per_s,
                 latency_s=intra["latency_s"], pcie_bytes_per_s=1.0, cpu_mem_bytes_per_s=1.0, cpu_adam_bytes=0.0,
                 overlap=0.0, compute_source=source)  # fmt: skip


def calibrated_flops(ddp: dict, intra: dict) -> tuple[float, float]:
    """(FLOP/s per rank, compute seconds): the one-host DDP step minus its all-reduce at the probed loopback rate."""
    work, info = record_workload(ddp), STRATEGIES["ddp"]
    one_host = Hardware(gpu_mem=0, gpus_per_node=ddp["world_size"], nodes=1)
    comm = step_time(info, work, one_host, rig_rates(1e30, intra, 1.0, "")).comm_s
    compute = ddp["step_time_s"] - comm
    return compute_seconds(work, rig_rates(1.0, intra, 1.0, "")) / compute, compute


def predict_rows(result: dict) -> None:
    """Annotate each two-host record (planned bytes per tier) and add the planner's step time to each row."""
    intra = result["intra_probe"]
    flops, compute = calibrated_flops(result["ddp_one_host"], intra)
    result["rates"] = {"compute_flops_per_s": flops, "compute_s": compute, "intra_bytes_per_s": intra["bytes_per_s"],
                       "latency_s": intra["latency_s"], "overlap": 0.0, "inter_bytes_per_s": {}}  # fmt: skip
    for rate in dict.fromkeys(r["rate"] for r in result["rows"]):
        group = [r["record"] for r in result["rows"] if r["rate"] == rate and r["record"]]
        annotate(group)
        inter = result["inter_probes"][rate]["bytes_per_s"] if rate == "none" else rate_bytes_per_s(rate)
        result["rates"]["inter_bytes_per_s"][rate] = inter
        rates = rig_rates(flops, intra, inter, "one-host ddp")
        overhead = one_host_overheads(result, rates)
        for row in result["rows"]:
            if row["rate"] == rate and row["record"]:
                row["predicted_step_s"] = predict(row["record"], rates)
                if row["strategy"] in overhead:
                    row["predicted_with_overhead_s"] = row["predicted_step_s"] + overhead[row["strategy"]]


def one_host_overheads(result: dict, rates: Rates) -> dict[str, float]:
    """Per strategy: measured minus predicted step on one host with the same 4 ranks (loopback only). What the
    planner misses there is no link term: DeepSpeed's and FSDP2's own CPU work per step (hooks, flat-buffer and
    bucket copies, partitioned optimizer bookkeeping), which on these shared cores adds to the step."""
    found = {}
    for record in result.get("one_host_all", []):
        found[record["strategy"]] = record["step_time_s"] - predict(record, rates)
    result["overhead_s"] = found
    return found


def predict(record: dict, rates: Rates) -> float:
    hardware = Hardware(gpu_mem=0, gpus_per_node=record["ranks_per_node"], nodes=record["nnodes"])
    return step_time(STRATEGIES[record["strategy"]], record_workload(record), hardware, rates).step_s


def tiers(record: dict) -> tuple[dict, dict]:
    """(counted, planned) ring bytes per step, all ranks, by tier."""
    comm = record["comm_bytes_per_step"]
    planned = (comm.get("predicted") or predicted_comm(record))["all_ranks_by_tier"]
    return comm["ring_bytes_sent_all_ranks_by_tier"], planned


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def _rank(values: dict[str, float]) -> list[str]:
    return sorted(values, key=values.get)


def bytes_table(result: dict, rates: list[str]) -> str:
    by = {(r["strategy"], r["rate"]): r for r in result["rows"]}
    lines = ["| strategy | inter-node MiB/step counted (planned) | intra-node MiB/step counted (planned) | "
             + " | ".join(f"veth tx MiB/step at {rate}" for rate in rates) + " |",
             "|---|---|---|" + "---|" * len(rates)]  # fmt: skip
    for name in dict.fromkeys(r["strategy"] for r in result["rows"]):
        first = next((by[(name, rate)]["record"] for rate in rates if by[(name, rate)]["record"]), None)
        if first is None:
            lines.append(f"| {name} | FAILED | |" + " |" * len(rates))
            continue
        counted, planned = tiers(first)
        steps = first["steps"]
        wire = [by[(name, rate)]["wire_tx_bytes_per_run"] for rate in rates]
        lines.append(f"| {name} | {_mib(counted['inter_node'])} ({_mib(planned['inter_node'])}) | "
                     f"{_mib(counted['intra_node'])} ({_mib(planned['intra_node'])}) | "
                     + " | ".join(_mib(sum(w) / steps) for w in wire) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def time_table(result: dict, rates: list[str]) -> str:
    by = {(r["strategy"], r["rate"]): r for r in result["rows"]}
    what = "measured / planner (error)" + (" / planner + overhead (error)" if result.get("overhead_s") else "")
    head = " | ".join(f"{rate}: {what}" for rate in rates)
    slow = " | ".join(f"slowdown at {rate}" for rate in rates[1:])
    lines = [f"| strategy | {head} | {slow} |", "|---|" + "---|" * (2 * len(rates) - 1)]
    for name in dict.fromkeys(r["strategy"] for r in result["rows"]):
        cells, base = [], by[(name, rates[0])]["record"]
        for rate in rates:
            row = by[(name, rate)]
            if not row["record"]:
                cells.append("FAILED")
                continue
            measured, predicted = row["record"]["step_time_s"], row["predicted_step_s"]
            cell = f"{measured:.3f} / {predicted:.3f} ({predicted / measured - 1:+.0%})"
            if "predicted_with_overhead_s" in row:
                with_overhead = row["predicted_with_overhead_s"]
                cell += f" / {with_overhead:.3f} ({with_overhead / measured - 1:+.0%})"
            cells.append(cell)
        for rate in rates[1:]:
            row = by[(name, rate)]
            ok = base and row["record"]
            cells.append(f"{row['record']['step_time_s'] / base['step_time_s']:.2f}x" if ok else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ranking_lines(result: dict, rates: list[str], key: str, label: str) -> list[str]:
    lines = []
    for rate in rates:
        rows = [r for r in result["rows"] if r["rate"] == rate and key in r]
        measured = _rank({r["strategy"]: r["record"]["step_time_s"] for r in rows})
        predicted = _rank({r["strategy"]: r[key] for r in rows})
        misses = [r["strategy"] for r in rows if abs(r[key] / r["record"]["step_time_s"] - 1) > TOLERANCE]
        lines.append(f"- {label}, {rate}: measured fastest first {', '.join(measured)}; predicted "
                     f"{', '.join(predicted)} ({'same ranking' if measured == predicted else 'ranking differs'});"
                     f" outside ±{TOLERANCE:.0%}: {', '.join(misses) or 'none'}")  # fmt: skip
    return lines


def rates_text(result: dict) -> str:
    r = result["rates"]
    inter = ", ".join(f"{k} {v / 1e6:.1f} MB/s" for k, v in r["inter_bytes_per_s"].items())
    probes = ", ".join(f"{k} {v['bytes_per_s'] / 1e6:.1f} MB/s" for k, v in result["inter_probes"].items())
    return (f"Rates: compute {r['compute_flops_per_s'] / 1e9:.2f} GFLOP/s per rank (one-host 4-rank ddp step "
            f"{result['ddp_one_host']['step_time_s']:.3f} s, of it compute {r['compute_s']:.3f} s); intra-node "
            f"(loopback probe, 4 ranks) {r['intra_bytes_per_s'] / 1e6:.0f} MB/s per rank; latency "
            f"{r['latency_s'] * 1e3:.2f} ms per call; overlap 0; inter-node per host: {inter}. The veth probe "
            f"(8 MiB all-reduce, one rank per host) measured: {probes}.\n")  # fmt: skip


def write_report(result: dict, rates: list[str], out: Path) -> str:
    from benchmarks.link_cap_plots import plot_bytes, plot_predicted

    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    first = next(r["record"] for r in result["rows"] if r["record"])
    text = (f"# Two hosts x {first['ranks_per_node']} ranks, link uncapped and capped\n\nCommands:\n\n"
            + "".join(f"    {command}\n" for command in result["commands"]) + "\n"
            "## Bytes per step by link tier (ring model, all ranks; veth tx: the kernel's count per step of the "
            "whole run, start-up included)\n\n" + bytes_table(result, rates)
            + "\n## Step time: measured vs the planner (zero_kit.plan.timing)\n\n" + time_table(result, rates)
            + "\n" + "\n".join(ranking_lines(result, rates, "predicted_step_s", "planner"))
            + "\n" + "\n".join(ranking_lines(result, rates, "predicted_with_overhead_s", "planner + overhead"))
            + "\n\n" + rates_text(result)
            + f"\nModel {first['model']['n_params']} parameters ({first['model']['layers']} layers, hidden "
            f"{first['model']['hidden']}), seq {first['model']['seq_len']}, micro batch {first['batch']['micro']}, "
            f"{first['steps']} steps ({first['warmup']} warm-up), {first['precision']}. Versions {first['versions']}; "
            f"hardware {first['hardware']}. All numbers from one run; the 4 ranks share 2 CPU cores.\n")  # fmt: skip
    (out / "table.md").write_text(text, encoding="utf-8")
    plot_bytes(result, out / "bytes_by_tier.png")
    plot_predicted(result, out / "predicted_vs_measured.png")
    return text

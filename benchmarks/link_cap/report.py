"""Predictions, tables and plots of benchmarks/link_cap/run.py: the planner's step time (zero_kit.plan.timing) for
every run, with rates measured on the rig, next to the measured step time and the counted bytes per link tier.

The planner is calibrated as `zero-kit plan --calibrate` does it (zero_kit.plan.calibration) from the one-host
runs of the same 4 ranks, counted as 2 simulated nodes of 2 (the two-host runs' process groups, every link the
loopback): compute = the FLOP/s per rank at which it reproduces the one-host DDP step (its loopback
all-reduce taken off), and each strategy's overhead (its one-host step minus the model's).
Rates (all stated in table.md): intra-node = the loopback probe (4 ranks on one host); inter-node = the veth probe
uncapped, the tbf rate itself when capped (the rate per host egress); latency = the probed 4-byte all-reduce;
collectives: gloo (a reduce-scatter is an all-reduce on the wire); overlap 0: the 4 ranks share 2 CPU cores, so
gloo's communication runs on the same cores as the compute and hides nothing; host copy rate = the loopback probe
(what the ranks' CPUs move when no link limits them: the overhead overlaps only the wait beyond it).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from benchmarks.link_cap.plots import plot_bytes, plot_predicted
from zero_kit.bench.report import annotate, predicted_comm
from zero_kit.plan.calibration import calibrate, layout_of, record_step
from zero_kit.plan.parallel import parallel_collectives, record_layout
from zero_kit.plan.rates import Rates
from zero_kit.plan.timing import on_the_wire
from zero_kit.plan.traffic import collectives, tier_bytes
from zero_kit.plan.workload import from_record
from zero_kit.strategies import STRATEGIES

TOLERANCE = 0.25
TIE = 0.10
"""Measured step times closer than this are within the run-to-run noise of this rig (table.md states it)."""
UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bytes_per_s(rate: str) -> float:
    unit = next(u for u in UNITS if rate.endswith(u))
    return float(rate[: -len(unit)]) * UNITS[unit] / 8


def rig_rates(flops_per_s: float, intra: dict, inter_bytes_per_s: float, source: str) -> Rates:
    return Rates(flops_per_s=flops_per_s, intra_bytes_per_s=intra["bytes_per_s"], inter_bytes_per_s=inter_bytes_per_s,
                 latency_s=intra["latency_s"], pcie_bytes_per_s=1.0, cpu_mem_bytes_per_s=1.0, cpu_adam_bytes=0.0,
                 overlap=0.0, compute_source=source, comm_backend="gloo",
                 host_copy_bytes_per_s=intra["bytes_per_s"])  # fmt: skip


def one_host_records(result: dict) -> list[dict]:
    """The calibration run: every strategy on one host, else (a DDP-only calibration) the one-host DDP alone."""
    return result.get("one_host_all") or [result["ddp_one_host"]]


def predict_rows(result: dict) -> None:
    """Annotate each two-host record (planned bytes per tier) and add the planner's step time to each row: without
    and with the calibrated per-strategy overhead."""
    intra = result["intra_probe"]
    result["rates"] = {"intra_bytes_per_s": intra["bytes_per_s"], "latency_s": intra["latency_s"], "overlap": 0.0,
                       "inter_bytes_per_s": {}}  # fmt: skip
    # the one-host runs count 2 simulated nodes of 2 whose "inter-node" link is the loopback too
    calibration = calibrate(
        one_host_records(result), "the one-host runs", rig_rates(1.0, intra, intra["bytes_per_s"], "")
    )
    result["rates"]["compute_flops_per_s"] = calibration.flops_per_s
    result["overhead_s"] = dict(calibration.overhead_s) if "one_host_all" in result else {}
    for rate in dict.fromkeys(r["rate"] for r in result["rows"]):
        group = [r["record"] for r in result["rows"] if r["rate"] == rate and r["record"]]
        annotate(group)
        inter = result["inter_probes"][rate]["bytes_per_s"] if rate == "none" else rate_bytes_per_s(rate)
        result["rates"]["inter_bytes_per_s"][rate] = inter
        plain = rig_rates(calibration.flops_per_s, intra, inter, calibration.source)
        with_overhead = replace(plain, overhead_s=result["overhead_s"])
        for row in result["rows"]:
            if row["rate"] == rate and row["record"]:
                step = record_step(row["record"], plain)
                row["predicted_step_s"], row["predicted_comm_s"] = step.step_s, step.comm_s
                if row["strategy"] in result["overhead_s"]:
                    row["predicted_with_overhead_s"] = predict(row["record"], with_overhead)


def predict(record: dict, rates: Rates) -> float:
    """The planner's step: zero_kit.plan.timing, or for zero1_tp / pp zero_kit.plan.parallel_options (TP's
    all-reduces, the pipeline's bubble and activations)."""
    return record_step(record, rates).step_s


def record_collectives(record: dict) -> list:
    """The planner's collectives of one step of this record (data-parallel, or a tensor/pipeline layout's)."""
    info, layout = STRATEGIES[record["strategy"]], layout_of(record)
    if info.model_parallel > 1:
        parallel, work = record_layout(record)
        return parallel_collectives(work, parallel, layout.world_size)
    return collectives(info, from_record(record), layout.gpus_per_node)


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
    lines = ["| strategy | inter-node MiB/step counted (planned) | intra-node MiB/step counted (planned) | inter-node "
             "MiB/step on the wire, gloo (planned) | " + " | ".join(f"veth tx MiB/step at {rate}" for rate in rates)
             + " |", "|---|---|---|---|" + "---|" * len(rates)]  # fmt: skip
    for name in dict.fromkeys(r["strategy"] for r in result["rows"]):
        first = next((by[(name, rate)]["record"] for rate in rates if by[(name, rate)]["record"]), None)
        if first is None:
            lines.append(f"| {name} | FAILED | | |" + " |" * len(rates))
            continue
        counted, planned = tiers(first)
        steps = first["steps"]
        wire = [by[(name, rate)]["wire_tx_bytes_per_run"] for rate in rates]
        lines.append(f"| {name} | {_mib(counted['inter_node'])} ({_mib(planned['inter_node'])}) | "
                     f"{_mib(counted['intra_node'])} ({_mib(planned['intra_node'])}) | {_mib(gloo_wire(first))} | "
                     + " | ".join(_mib(sum(w) / steps) for w in wire) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def gloo_wire(record: dict) -> float:
    """Inter-node bytes per step, all ranks, as gloo sends them (its reduce-scatter is an all-reduce)."""
    layout = layout_of(record)
    return sum(tier_bytes(on_the_wire(c, "gloo"), layout.nodes, layout.gpus_per_node).inter_node
               for c in record_collectives(record))  # fmt: skip


def wire_table(result: dict) -> str:
    """What one call of each collective sent over each host's veth (8 MiB payload, 4 ranks) vs the ring model."""
    wire = result.get("wire") or {}
    if not wire:
        return ""
    lines = ["| collective | ring model MiB per host | " + " | ".join(f"veth MiB per host at {r}" for r in wire)
             + " | veth / ring |", "|---|---|" + "---|" * (len(wire) + 1)]  # fmt: skip
    for kind in next(iter(wire.values()))["kinds"]:
        ring = next(iter(wire.values()))["kinds"][kind]["ring_bytes_per_call_per_host"]
        sent = [sum(w["kinds"][kind]["wire_bytes_per_call_by_host"]) / 2 for w in wire.values()]
        lines.append(f"| {kind} | {_mib(ring)} | " + " | ".join(_mib(b) for b in sent)
                     + f" | {max(sent) / ring:.2f} |")  # fmt: skip
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


def summary_table(result: dict, rates: list[str]) -> str:
    """One line per strategy (issue 26's table): fp32 loss against DDP, model-state bytes of the fullest rank,
    inter-node bytes counted vs planned, and the step time at every rate, measured vs the planner (+ overhead)."""
    by = {(r["strategy"], r["rate"]): r for r in result["rows"]}
    heads = " | ".join(f"step s at {rate}: measured / planner + overhead (error)" for rate in rates)
    lines = ["| strategy | max abs loss diff vs ddp | state MiB/rank, fullest: measured (planned) | inter-node "
             f"MiB/step, all ranks: counted (planned) | {heads} |", "|---|---|---|---|" + "---|" * len(rates)]  # fmt: skip
    for name in dict.fromkeys(r["strategy"] for r in result["rows"]):
        records = [by[(name, rate)]["record"] for rate in rates if by[(name, rate)]["record"]]
        if not records:
            lines.append(f"| {name} | FAILED | | |" + " |" * len(rates))
            continue
        first, state = records[0], records[0]["model_state_bytes_per_rank"]
        planned = (state.get("predicted") or {}).get("all_ranks_total") or [0]
        diffs = [r.get("max_abs_loss_diff_vs_ddp") for r in records if r.get("max_abs_loss_diff_vs_ddp") is not None]
        counted, tier_plan = tiers(first)
        cells = [f"{max(diffs):.1e}" if diffs else "-",
                 f"{_mib(max(rank['total'] for rank in state['all_ranks']))} ({_mib(max(planned))})",
                 f"{_mib(counted['inter_node'])} ({_mib(tier_plan['inter_node'])})"]  # fmt: skip
        for rate in rates:
            row = by[(name, rate)]
            guess = row.get("predicted_with_overhead_s", row.get("predicted_step_s"))
            measured = row["record"]["step_time_s"] if row["record"] else None
            cells.append(f"{measured:.3f} / {guess:.3f} ({guess / measured - 1:+.0%})" if measured else "FAILED")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def inverted_pairs(measured: dict[str, float], predicted: dict[str, float]) -> list[tuple[str, str, float]]:
    """(faster, slower, measured gap) of every pair the prediction orders the other way than the measurement."""
    names = list(measured)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            fast, slow = (a, b) if measured[a] <= measured[b] else (b, a)
            if predicted[fast] > predicted[slow]:
                out.append((fast, slow, measured[slow] / measured[fast] - 1))
    return out


def ranking_lines(result: dict, rates: list[str], key: str, label: str) -> list[str]:
    lines = []
    for rate in rates:
        rows = [r for r in result["rows"] if r["rate"] == rate and key in r]
        times = {r["strategy"]: r["record"]["step_time_s"] for r in rows}
        guesses = {r["strategy"]: r[key] for r in rows}
        measured, predicted = _rank(times), _rank(guesses)
        misses = [r["strategy"] for r in rows if abs(r[key] / r["record"]["step_time_s"] - 1) > TOLERANCE]
        inverted = inverted_pairs(times, guesses)
        wide = [f"{a} < {b} by {gap:.0%}" for a, b, gap in inverted if gap > TIE]
        pairs = len(rows) * (len(rows) - 1) // 2
        lines.append(f"- {label}, {rate}: measured fastest first {', '.join(measured)}; predicted "
                     f"{', '.join(predicted)} ({'same ranking' if measured == predicted else 'ranking differs'}:"
                     f" {len(inverted)} of {pairs} pairs inverted, of them measured more than {TIE:.0%} apart: "
                     f"{', '.join(wide) or 'none'}); outside ±{TOLERANCE:.0%}: {', '.join(misses) or 'none'}")  # fmt: skip
    return lines


def rates_text(result: dict) -> str:
    r = result["rates"]
    inter = ", ".join(f"{k} {v / 1e6:.1f} MB/s" for k, v in r["inter_bytes_per_s"].items())
    probes = ", ".join(f"{k} {v['bytes_per_s'] / 1e6:.1f} MB/s" for k, v in result["inter_probes"].items())
    ddp = next(rec for rec in one_host_records(result) if rec["strategy"] == "ddp")
    overhead = ", ".join(f"{k} {v * 1e3:+.0f}" for k, v in result.get("overhead_s", {}).items())
    return (f"Rates: compute {r['compute_flops_per_s'] / 1e9:.2f} GFLOP/s per rank (one-host 4-rank ddp step "
            f"{ddp['step_time_s']:.3f} s, its all-reduce taken off); overhead ms per step (one host): "
            f"{overhead or 'not measured'}; collectives gloo (reduce-scatter = all-reduce); intra-node "
            f"(loopback probe, 4 ranks) {r['intra_bytes_per_s'] / 1e6:.0f} MB/s per rank; latency "
            f"{r['latency_s'] * 1e3:.2f} ms per call; overlap 0; inter-node per host: {inter}. The veth probe "
            f"(8 MiB all-reduce, one rank per host) measured: {probes}.\n")  # fmt: skip


def write_report(result: dict, rates: list[str], out: Path) -> str:
    (out / "results.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    first = next(r["record"] for r in result["rows"] if r["record"])
    text = (f"# Two hosts x {first['ranks_per_node']} ranks, link uncapped and capped\n\nCommands:\n\n"
            + "".join(f"    {command}\n" for command in result["commands"]) + "\n"
            "## Summary: loss, state bytes, inter-node bytes, step time (loss: the largest fp32 difference from ddp "
            "over every step and rate)\n\n" + summary_table(result, rates) + "\n"
            "## Bytes per step by link tier (ring model, all ranks; veth tx: the kernel's count per step of the "
            "whole run, start-up included)\n\n" + bytes_table(result, rates)
            + "\n## What each gloo collective sends over the veth (benchmarks/link_cap/probe.py --wire, 2 hosts x 2 "
            "ranks, 8 MiB payload, per call)\n\n" + wire_table(result)
            + "\n## Step time: measured vs the planner (zero_kit.plan.timing)\n\n" + time_table(result, rates)
            + "\n" + "\n".join(ranking_lines(result, rates, "predicted_step_s", "planner"))
            + "\n" + "\n".join(ranking_lines(result, rates, "predicted_with_overhead_s", "planner + overhead"))
            + "\n\n" + rates_text(result)
            + f"\nModel {first['model']['n_params']} parameters ({first['model']['layers']} layers, hidden "
            f"{first['model']['hidden']}), seq {first['model']['seq_len']}, micro batch {first['batch']['micro']}, "
            f"{first['steps']} steps ({first['warmup']} warm-up), {first['precision']}. Versions {first['versions']}; "
            f"hardware {first['hardware']}. All numbers from one run; the 4 ranks share 2 CPU cores.\n")  # fmt: skip
    (out / "table.md").write_text(text, encoding="utf-8")
    first_rate = [r for r in result["rows"] if r["rate"] == result["rows"][0]["rate"] and r["record"]]
    counted, planned = zip(*(tiers(r["record"]) for r in first_rate), strict=True) if first_rate else ((), ())
    plot_bytes([r["strategy"] for r in first_rate], list(counted), list(planned), out / "bytes_by_tier.png")
    plot_predicted(result, out / "predicted_vs_measured.png", TOLERANCE)
    return text

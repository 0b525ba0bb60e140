"""Multi-node comparison with the inter-node link capped: every strategy runs across two network-namespace hosts
(one rank each, gloo over real TCP through a veth pair), first at full speed, then with each host's egress
capped by a token bucket (tc tbf) to emulate commodity Ethernet. Reports how each strategy's step time degrades
next to the bytes it sends. Needs root and iproute2. Run from the repository root:

    python benchmarks/link_cap.py --rate 200mbit --out benchmarks/results/link_cap

Namespaces zkb20 / zkb21 (10.78.2.1 / .2), ports 29740-29759; removed on exit, also on failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.rigs.two_host_bench import _print, run_two_hosts, two_hosts  # noqa: E402
from zero_kit.bench import BenchOptions  # noqa: E402


def _rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    unit = next(u for u in units if rate.endswith(u))
    return float(rate[: -len(unit)]) * units[unit]


def run(strategies: list[str], rate: str, opts: BenchOptions, out: Path) -> list[dict]:
    rows = []
    for capped, (prefix, subnet) in ((None, ("zkb2", 2)), (rate, ("zkb3", 3))):
        with two_hosts(prefix, subnet, rate=capped) as hosts:
            for index, name in enumerate(strategies):
                run_opts = dataclasses.replace(opts, master_port=opts.master_port + index + (10 if capped else 0))
                record = run_two_hosts(name, run_opts, hosts, out / "logs" / (capped or "full"), _print)
                rows.append({"strategy": name, "link": capped or "veth (uncapped)", "record": record})
    return rows


def table(rows: list[dict], rate: str) -> str:
    lines = [
        f"| strategy | comm MiB/step/rank (ring) | step s uncapped | step s at {rate} | slowdown | wire time at {rate} s |",
        "|---|---|---|---|---|---|",
    ]
    by = {(r["strategy"], r["link"] != "veth (uncapped)"): r["record"] for r in rows}
    for name in dict.fromkeys(r["strategy"] for r in rows):
        full, slow = by.get((name, False)), by.get((name, True))
        if not full or not slow:
            lines.append(f"| {name} | FAILED (see logs/) | | | | |")
            continue
        sent = slow["comm_bytes_per_step"]["ring_bytes_sent_per_rank"]
        lines.append(
            f"| {name} | {sent / 2**20:.2f} | {full['step_time_s']:.3f} | {slow['step_time_s']:.3f} |"
            f" {slow['step_time_s'] / full['step_time_s']:.1f}x | {sent * 8 / _rate_bits(rate):.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--strategies", default="ddp,fsdp,zero1,zero2,zero3")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default="benchmarks/results/link_cap")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    opts = BenchOptions(nproc=1, steps=args.steps, warmup=2, master_port=29740, timeout=400, out=str(out))
    rows = run(args.strategies.split(","), args.rate, opts, out)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    text = table(rows, args.rate)
    first = next((r["record"] for r in rows if r["record"]), None)
    if first:
        text += f"\nModel {first['model']}, batch {first['batch']}, {first['steps']} steps ({first['warmup']} warm-up)."
        text += f"\nVersions {first['versions']}; hardware {first['hardware']}.\n"
    text += "\nCommand: python benchmarks/link_cap.py --rate " + args.rate + "\n"
    (out / "table.md").write_text(text, encoding="utf-8")
    print(text)
    return 0 if all(r["record"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

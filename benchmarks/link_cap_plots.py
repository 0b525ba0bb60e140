"""Plots of benchmarks/link_cap.py (matplotlib, Agg): bytes per step by link tier, predicted vs measured step time."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bytes(result: dict, path: Path) -> None:
    from benchmarks.link_cap_report import tiers

    plt = _plt()
    rate = result["rows"][0]["rate"]
    rows = [r for r in result["rows"] if r["rate"] == rate and r["record"]]
    names = [r["strategy"] for r in rows]
    counted = [tiers(r["record"])[0] for r in rows]
    planned = [tiers(r["record"])[1] for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for offset, tier, color in ((-0.2, "inter_node", "tab:red"), (0.2, "intra_node", "tab:blue")):
        ax.bar([x + offset for x in xs], [c[tier] / 2**20 for c in counted], 0.4, color=color,
               label=f"{tier.replace('_', '-')} (counted)")  # fmt: skip
        ax.scatter([x + offset for x in xs], [p[tier] / 2**20 for p in planned], color="black", marker="_", s=300,
                   zorder=3, label="planned" if tier == "inter_node" else None)  # fmt: skip
    ax.set_xticks(list(xs), names, rotation=30, ha="right")
    ax.set_ylabel("MiB per step, all ranks")
    ax.set_title("Ring bytes per step by link tier, 2 hosts x 2 ranks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_predicted(result: dict, path: Path) -> None:
    from benchmarks.link_cap_report import TOLERANCE

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 6))
    rows = [r for r in result["rows"] if r["record"]]
    for rate, marker in zip(dict.fromkeys(r["rate"] for r in rows), "os^vD", strict=False):
        group = [r for r in rows if r["rate"] == rate]
        ax.scatter([r["record"]["step_time_s"] for r in group], [r["predicted_step_s"] for r in group], marker=marker,
                   label="uncapped" if rate == "none" else rate)  # fmt: skip
        for r in group:
            ax.annotate(r["strategy"], (r["record"]["step_time_s"], r["predicted_step_s"]), fontsize=6)
        extra = [r for r in group if "predicted_with_overhead_s" in r]
        if extra:
            ax.scatter([r["record"]["step_time_s"] for r in extra], [r["predicted_with_overhead_s"] for r in extra],
                       marker=marker, facecolors="none", edgecolors="black", label=f"{rate}, + calibrated overhead")  # fmt: skip
    values = [r["record"]["step_time_s"] for r in rows] + [r["predicted_step_s"] for r in rows]
    lo, hi = min(values) * 0.8, max(values) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1)
    ax.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)], [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)],
                    color="gray", alpha=0.2, label=f"±{TOLERANCE:.0%}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("Planner vs measured, 2 hosts x 2 ranks", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

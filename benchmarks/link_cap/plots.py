"""Plots of the link_cap study (matplotlib, Agg): bytes per step by link tier, predicted vs measured step time.

Drawing only: benchmarks.link_cap.report computes what is drawn and passes it in (this module imports nothing of
the study, so the two do not import each other)."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bytes(names: list[str], counted: list[dict], planned: list[dict], path: Path) -> None:
    """One pair of bars per strategy: `counted` and `planned` ring bytes per step by tier (all ranks)."""
    plt = _plt()
    xs = range(len(names))
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


def plot_predicted(result: dict, path: Path, tolerance: float) -> None:
    """Predicted against measured step time of every run, with the ±`tolerance` band."""
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
    ax.fill_between([lo, hi], [lo * (1 - tolerance), hi * (1 - tolerance)], [lo * (1 + tolerance), hi * (1 + tolerance)],
                    color="gray", alpha=0.2, label=f"±{tolerance:.0%}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("Planner vs measured, 2 hosts x 2 ranks", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

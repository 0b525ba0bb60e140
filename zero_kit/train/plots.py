"""The picture at the end of a run: OUTPUT/loss.png, train loss (and eval loss, where the log has it) over steps,
drawn from OUTPUT/train_log.jsonl by rank 0 when training ends (also after a stop: what was trained so far)."""

from __future__ import annotations

import json
from pathlib import Path

from zero_kit.train.stopping import LOG_FILE

LOSS_PNG = "loss.png"


def loss_points(log_path: Path) -> dict[str, list[tuple[int, float]]]:
    """{"train": [(step, loss)], "eval": [(step, eval_loss)]}, by step. A resumed run appends to the same log and may
    log a step again: the last record of a step wins. A line cut short by a kill is skipped."""
    series: dict[str, dict[int, float]] = {"train": {}, "eval": {}}
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            continue
        for name, key in (("train", "loss"), ("eval", "eval_loss")):
            if isinstance(record.get(key), (int, float)):
                series[name][record["step"]] = float(record[key])
    return {name: sorted(points.items()) for name, points in series.items()}


def write_loss_plot(output: Path) -> Path | None:
    """OUTPUT/loss.png from the run's log; None when the log holds no loss yet."""
    points = loss_points(output / LOG_FILE)
    if not points["train"] and not points["eval"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, style in (("train", "-"), ("eval", "o-")):
        if points[name]:
            steps, losses = zip(*points[name], strict=True)
            ax.plot(steps, losses, style, label=f"{name} loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(f"{output.name}: loss over steps")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = output / LOSS_PNG
    partial = path.with_name(f".{LOSS_PNG}.partial")
    fig.savefig(partial, format="png", dpi=100)
    plt.close(fig)
    partial.replace(path)  # a reader never sees half a picture
    return path

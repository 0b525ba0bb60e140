"""The suite's summary: OUT/summary.md (one table per part, targets with their values) and PNG plots, from
OUT/suite.jsonl alone, so `python -m benchmarks.gpu.summary OUT` re-renders a cut-off or copied run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _runs_table(runs: list[dict]) -> list[str]:
    lines = ["| strategy | tokens/s | MFU (datasheet) | MFU (measured peak) | alloc GiB | reserved GiB | optimizer |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        if r.get("failed"):
            lines.append(f"| {r['strategy']} | failed | | | | | |")
            continue
        opt = r.get("optimizer") or {}
        opt_name = opt.get("basic_optimizer") or ("client" if opt.get("client_optimizer") else "-")
        lines.append(f"| {r['strategy']} | {_fmt(r['tokens_per_s'], 4)} | {_fmt(r.get('mfu_datasheet'))} | "
                     f"{_fmt(r.get('mfu_measured_peak'))} | {_gib(r.get('cuda_allocated'))} | "
                     f"{_gib(r.get('cuda_reserved'))} | {opt_name} |")  # fmt: skip
    return lines


def render(records: list[dict]) -> str:
    head = records[0] if records else {}
    lines = ["# GPU suite", "", f"versions: `{json.dumps(head.get('versions', {}))}`",
             f"hardware: `{json.dumps(head.get('hardware', {}))}`", "",
             "| part | status | wall s | reason |", "|---|---|---|---|"]  # fmt: skip
    for r in records:  # the reason's last line (an error's message), no pipes: one table row each
        reason = (r["reason"] or "").strip().splitlines()[-1:] or [""]
        lines.append(f"| {r['part']} | {r['status']} | {r['wall_s']:.0f} | {reason[0].replace('|', '/')} |")
    for r in records:
        data = r.get("data", {})
        if r["part"] == "environment" and r["status"] == "ok":
            mm, cp = data["matmul"], data["copy"]
            lines += ["", "## environment", f"{data['device']}, torch {data['torch']}, CUDA {data['cuda']}, NCCL "
                      f"{data['nccl']}, bf16 {data['bf16_supported']}; matmul {mm['shape']} {mm['dtype']}: "
                      f"{mm['tflops']:.1f} TFLOP/s; copy {cp['what']}: {cp['gb_per_s_read_plus_write']:.1f} GB/s"]  # fmt: skip
        if r["part"] in ("correctness", "throughput", "compile") and data.get("runs"):
            lines += ["", f"## {r['part']}", *_runs_table(data["runs"])]
            if r["part"] == "correctness":
                lines.append(f"within tolerance {data['tolerance']}: `{json.dumps(data['within_tolerance'])}`")
            if data.get("targets"):
                lines.append(f"targets: `{json.dumps(data['targets'])}`")
        if r["part"] == "sweep" and data.get("runs"):
            lines += ["", "## sweep (--zero-override against the generator's settings, same model and batch)",
                      "| setting | strategy | tokens/s | x generated | reserved GiB |", "|---|---|---|---|---|"]  # fmt: skip
            for run in data["runs"]:
                rate = "failed" if run.get("failed") else _fmt(run.get("tokens_per_s"), 4)
                rate = f"not launched: {run['checked']}" if run.get("checked") else rate
                lines.append(f"| {run['setting']} | {run['strategy']} | {rate} | "
                             f"{_fmt(run.get('vs_generated_tokens_per_s'))} | {_gib(run.get('cuda_reserved'))} |")  # fmt: skip
        if r["part"] == "zeropp" and data.get("train_runs"):
            lines += ["", "## zeropp (zero-kit train --ds-config, 1 GPU)", "| run | exit | last loss | max rel loss diff"
                      " vs zero3 |", "|---|---|---|---|"]  # fmt: skip
            for name, run in data["train_runs"].items():
                last = run.get("losses", [None])[-1:] or [None]
                lines.append(f"| {name} | {run['exit_code']} | {_fmt(last[0])} | "
                             f"{_fmt(run.get('max_rel_loss_diff_vs_zero3'))} |")  # fmt: skip
        if r["part"] == "planner" and data.get("comparisons"):
            lines += ["", "## planner", "| strategy | seq | micro | predicted GiB | measured reserved+context GiB | "
                      "error |", "|---|---|---|---|---|---|"]  # fmt: skip
            for c in data["comparisons"]:
                if not c.get("failed"):
                    lines.append(f"| {c['strategy']} | {c['seq_len']} | {c['micro_batch']} | "
                                 f"{_gib(c['predicted_total'])} | {_gib(c['measured_reserved_plus_context'])} | "
                                 f"{_fmt(c['rel_error'])} |")  # fmt: skip
            lines.append(f"overhead: `{json.dumps(data['overhead'])}`; targets: `{json.dumps(data['targets'])}`")
    return "\n".join(lines) + "\n"


def plots(records: list[dict], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for r in records:
        runs = [x for x in r.get("data", {}).get("runs", []) if isinstance(x, dict) and not x.get("failed")]
        if r["part"] == "correctness" and runs:
            fig, ax = plt.subplots(figsize=(6, 4))
            for run in runs:
                ax.plot(range(1, len(run["losses"]) + 1), run["losses"], label=run["strategy"])
            ax.set(xlabel="step", ylabel="loss", title=f"correctness ({r['data']['precision']})")
            ax.legend()
        elif r["part"] == "throughput" and runs:
            fig, ax = plt.subplots(figsize=(7, 4))
            ax.bar([x["strategy"] for x in runs], [x["tokens_per_s"] for x in runs])
            ax.set(ylabel="tokens/s", title="~1B LLaMA, seq 2048, bf16, 1 GPU")
        else:
            continue
        path = out / f"{r['part']}.png"
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        written.append(str(path))
    return written


def write_summary(out: Path) -> Path:
    records = [json.loads(line) for line in (out / "suite.jsonl").read_text(encoding="utf-8").splitlines() if line]
    path = out / "summary.md"
    path.write_text(render(records), encoding="utf-8")
    plots(records, out)
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="a suite's output folder (holding suite.jsonl)")
    print(write_summary(parser.parse_args().out).read_text(encoding="utf-8"))

"""Turn benchmark records into results.jsonl, a markdown table and PNG plots (matplotlib, Agg backend).

Predicted model-state bytes come from `zero_kit.plan.accounting.model_state_bytes` (the planner's one table of
bytes per parameter), so measured and predicted sit side by side with the formula that produced the number.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from zero_kit.bench.user_config import record_info, table_notes
from zero_kit.strategies import SP_SUFFIX, STRATEGIES, is_user_config

PARITY_TOL = 1e-5
"""fp32: every step's loss within this of DDP's (absolute): the strategies compute the same sums."""
PARITY_REL_TOL_LOW_PRECISION = 0.01
PARITY_LOW_PRECISION_STEPS = 3
"""bf16/fp16: the first 3 steps' losses within 1% of DDP's (relative). DDP keeps fp32 weights under autocast,
DeepSpeed's bf16 keeps bf16 weights beside fp32 master copies: they round in other places, and at the bench's high
learning rate the difference compounds. On an H200 (1.2B LLaMA, seq 2048) ZeRO-0..3 matched DDP's first 3 losses
within 0.05% and differed by up to 2.7% by step 11: a wrong gradient shows at once, rounding only later."""


def loss_parity(losses: list[float], reference: list[float], precision: str) -> bool:
    """The losses equal DDP's: every step within PARITY_TOL in fp32; in bf16/fp16 the first
    PARITY_LOW_PRECISION_STEPS within PARITY_REL_TOL_LOW_PRECISION (relative)."""
    if not losses or len(losses) != len(reference):
        return False
    if precision == "fp32":
        return max(abs(a - b) for a, b in zip(losses, reference, strict=True)) <= PARITY_TOL
    head = list(zip(losses, reference, strict=True))[:PARITY_LOW_PRECISION_STEPS]
    return all(abs(a - b) <= PARITY_REL_TOL_LOW_PRECISION * abs(b) for a, b in head)


def failed_record(strategy: str, opts, log_path: str) -> dict[str, Any]:
    tail = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
    return {"strategy": strategy, "failed": True, "log": log_path, "log_tail": tail,
            "world_size": opts.nproc, "precision": opts.precision, "options": dataclasses.asdict(opts)}  # fmt: skip


def predicted_state(record: dict[str, Any]) -> dict[str, Any] | None:
    """The planner's prediction for this run (all bytes: on CPU device and host memory are the same RAM), per
    rank in `all_ranks_total`: ZeRO-1/2 keep the gradients of the parameters at their partition's edges whole,
    so each rank gets its own exact figure from the model's parameter sizes (accounting.py)."""
    from zero_kit.plan.accounting import DTYPE_BYTES, strategy_state_bytes, zero12_edge_grad_bytes

    info = record_info(record)
    if info is None:  # a record of a strategy this version no longer has
        return {"error": f"unknown strategy {record['strategy']!r}; choose from {sorted(STRATEGIES)}"}
    name, offload = info.accounting, info.offload_optimizer
    world, precision = record["world_size"], record["precision"]
    per_node = record.get("ranks_per_node") or world
    if info.model_parallel > 1:
        return _predicted_model_parallel(info, record)
    try:
        s = strategy_state_bytes(info, record["model"]["n_params"], world, per_node, precision)
    except ValueError as err:
        return {"error": str(err)}
    parts = {"params": s.params + s.host_params, "grads": s.grads + s.host_grads,
             "optimizer": s.optimizer + s.host_optimizer}  # fmt: skip
    formula = s.formula + (f" + host {s.host_formula}" if s.host_formula else "")
    base = sum(parts.values())
    edges = [0] * world
    numels = record["model"].get("param_numels")
    if name in ("zero1", "zero2") and not offload and numels:
        edges = zero12_edge_grad_bytes(numels, world, precision)
        formula += f" + (G_r - Ψ/N)·{DTYPE_BYTES[precision]}"
        parts["grads"] += edges[0]
    return {**parts, "total": base + edges[0], "formula": formula, "part_formulas": list(s.part_formulas),
            "paper_total": base, "all_ranks_total": [base + e for e in edges]}  # fmt: skip


def model_parallel_layout(info, record: dict[str, Any]):
    """The planner's Layout and Workload of a tensor- or pipeline-parallel record (zero_kit.plan.parallel)."""
    from zero_kit.plan.parallel import record_layout

    return record_layout({**record, "strategy": info.name})


def _predicted_model_parallel(info, record: dict[str, Any]) -> dict[str, Any]:
    """Tensor or pipeline parallelism, from the planner (zero_kit.plan.parallel): the parameters each rank holds
    (stage_params: AutoTP's split, the rank's stage; pipelines outermost, rank // (dp x tp) is the stage) under the
    byte-table row over the data-parallel ranks. ZeRO-1/2's edge gradients are not added (exact at one dp rank)."""
    from zero_kit.plan.accounting import model_state_bytes
    from zero_kit.plan.parallel import parallel_state_bytes, stage_params

    layout, work = model_parallel_layout(info, record)
    world = record["world_size"]
    dp = layout.dp(world)
    try:
        fullest = parallel_state_bytes(work, layout, world)
    except ValueError as err:
        return {"error": str(err)}
    held = [stage_params(work.shape, layout.tp, layout.pp)[rank // (dp * layout.tp)] for rank in range(world)]
    totals = [model_state_bytes(layout.base, n, dp, record["precision"]).total for n in held]
    # params/grads/optimizer/total: the fullest rank's, as `zero-kit plan` reports a layout; every rank's below
    return {"params": fullest.params, "grads": fullest.grads, "optimizer": fullest.optimizer, "total": fullest.total,
            "formula": fullest.formula + " (Ψr: parameters the rank holds)", "part_formulas": list(fullest.part_formulas),
            "paper_total": fullest.total, "all_ranks_total": totals, "params_held_by_rank": held,
            "source": "zero_kit.plan.parallel"}  # fmt: skip


def _predicted_comm_model_parallel(info, record: dict[str, Any]) -> dict[str, Any]:
    """The planner's bytes per link tier for a tp/pp record (parallel_collectives through traffic.tier_bytes)."""
    from zero_kit.plan.parallel import parallel_collectives
    from zero_kit.plan.traffic import TierBytes, tier_bytes

    layout, work = model_parallel_layout(info, record)
    world = record["world_size"]
    per_node = record.get("ranks_per_node") or world
    total = TierBytes()
    for collective in parallel_collectives(work, layout, world):
        total += tier_bytes(collective, world // per_node, per_node)
    return {"intra_node": total.intra_node, "inter_node": total.inter_node}


def predicted_comm(record: dict[str, Any]) -> dict[str, Any] | None:
    """The planner's ring bytes per step for this run, all ranks, by link tier (zero_kit.plan.traffic, the formulas
    `zero-kit plan` ranks and times with), and the measured bytes' error against them. None when the record lacks
    the model's shape (records written before it was recorded)."""
    from zero_kit.plan.traffic import step_tier_bytes
    from zero_kit.plan.workload import from_record

    info = record_info(record)
    if info is None or "intermediate" not in record["model"]:
        return None  # a record written before the model's shape was
    if record["batch"]["grad_accum"] != 1 and info.model_parallel == 1:
        return None  # the data-parallel traffic model counts one micro batch per step
    if info.model_parallel > 1:
        predicted = _predicted_comm_model_parallel(info, record)
    else:
        per_node = record.get("ranks_per_node") or record["world_size"]
        tiers = step_tier_bytes(info, from_record(record), record["world_size"] // per_node, per_node)
        predicted = {"intra_node": tiers.intra_node, "inter_node": tiers.inter_node}
    measured = record["comm_bytes_per_step"]["ring_bytes_sent_all_ranks_by_tier"]
    errors = {tier: (measured[tier] / p - 1 if p else None) for tier, p in predicted.items()}
    return {"all_ranks_by_tier": predicted, "error_by_tier": errors, "source": "zero_kit.plan.traffic"}


def same_arithmetic_as_ddp(record: dict[str, Any]) -> bool:
    """Whether the strategy computes what DDP computes at the run's precision (bf16 states do not in an fp32 run; a
    user's own config does not where it trains otherwise: user_config.differences)."""
    info = record_info(record)
    if (record.get("ds_config") or {}).get("differs_from_bench"):
        return False
    return not (info and info.low_precision_states and record["precision"] == "fp32")


def annotate(records: list[dict[str, Any]]) -> None:
    """Add predicted bytes (states, comm per tier), comm ratio to DDP and loss parity against DDP to every
    successful record."""
    ok = [r for r in records if not r.get("failed")]
    ddp = next((r for r in ok if r["strategy"] == "ddp"), None)
    for r in ok:
        r["model_state_bytes_per_rank"]["predicted"] = predicted_state(r)
        r["comm_bytes_per_step"]["predicted"] = predicted_comm(r)
        r["same_arithmetic_as_ddp"] = same_arithmetic_as_ddp(r)
        pred = r["model_state_bytes_per_rank"]["predicted"] or {}
        if pred.get("total"):  # the worst rank, measured against its own prediction
            measured = [rank["total"] for rank in r["model_state_bytes_per_rank"]["all_ranks"]]
            errors = [m / p - 1 for m, p in zip(measured, pred["all_ranks_total"], strict=True)]
            r["model_state_bytes_per_rank"]["error_vs_predicted"] = max(errors, key=abs)
        _against_sp1(r, ok)
        if ddp is None:
            continue
        base = ddp["comm_bytes_per_step"]["ring_bytes_sent_per_rank"]
        r["comm_ratio_vs_ddp"] = r["comm_bytes_per_step"]["ring_bytes_sent_per_rank"] / base if base else None
        diffs = [abs(a - b) for a, b in zip(r["losses"], ddp["losses"], strict=False)]
        r["max_abs_loss_diff_vs_ddp"] = max(diffs) if diffs else None
        r["loss_parity"] = loss_parity(r["losses"], ddp["losses"], r["precision"])


def _against_sp1(r: dict[str, Any], ok: list[dict[str, Any]]) -> None:
    """A `_spN` row beside its sp=1 twin of the same run (zero3_sp2 and zero3): per-step loss, gradient norm (the
    step furthest from the twin's, as a ratio), tokens/s and peak RSS, as `r["vs_sp1"]`; nothing without the twin."""
    sequence_parallel = (r.get("parallel") or {}).get("sequence", 1) > 1
    variant = SP_SUFFIX.match(r["strategy"]) if sequence_parallel else None
    twin = next((o for o in ok if variant and o["strategy"] == variant["base"]), None)
    if twin is None:
        return
    diffs = [abs(a - b) for a, b in zip(r["losses"], twin["losses"], strict=False)]
    rss, twin_rss = r["peak_mem_bytes"].get("rss"), twin["peak_mem_bytes"].get("rss")
    pairs = [(a, b) for a, b in zip(r.get("grad_norms") or [], twin.get("grad_norms") or [], strict=False) if a and b]
    r["vs_sp1"] = {"strategy": twin["strategy"], "max_abs_loss_diff": max(diffs) if diffs else None,
                   "loss_parity": loss_parity(r["losses"], twin["losses"], r["precision"]),
                   "grad_norm_ratio": max((a / b for a, b in pairs), key=lambda x: abs(x - 1)) if pairs else None,
                   "tokens_per_s_ratio": r["tokens_per_s"]["total"] / twin["tokens_per_s"]["total"],
                   "peak_rss_ratio": rss / twin_rss if rss and twin_rss else None}  # fmt: skip


def _sequence_parallel_notes(ok: list[dict[str, Any]]) -> list[str]:
    """Under the table: each `_spN` row's layout and how it compares with its sp=1 twin."""
    lines = []
    for r in ok:
        sp = (r.get("parallel") or {}).get("sequence", 1)
        if sp == 1:
            continue
        seq = r["model"]["seq_len"]
        line = (
            f"{r['strategy']}: Ulysses, {sp} ranks per row x data {r['parallel']['data']}; each rank holds"
            f" {seq // sp} of a row's {seq} tokens, in {r['batch']['grad_accum']} micro steps per step"
        )
        twin = r.get("vs_sp1")
        if twin:
            rss = twin["peak_rss_ratio"]
            line += (f"; against {twin['strategy']}: loss {'the same' if twin['loss_parity'] else 'NOT the same'}"
                     f" (max diff {twin['max_abs_loss_diff']:.1e}), gradient norm {_norm_ratio(twin)},"
                     f" tokens/s {twin['tokens_per_s_ratio']:.2f}x,"
                     f" peak RSS {'-' if rss is None else f'{rss:.2f}x'}")  # fmt: skip
        lines.append(line)
    return [""] + lines if lines else []


def _norm_ratio(twin: dict[str, Any]) -> str:
    ratio = twin.get("grad_norm_ratio")
    return "-" if ratio is None else f"{ratio:.6f}x"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def _row(r: dict[str, Any]) -> str:
    if r.get("failed"):
        return f"| {r['strategy']} | {r['world_size']} | {r['precision']} | FAILED, see {r['log']} |" + " |" * 10
    s = r["model_state_bytes_per_rank"]
    pred = s.get("predicted") or {}
    err = s.get("error_vs_predicted")
    parity = r.get("loss_parity")
    parity_text = "-" if parity is None else ("yes" if parity else "NO") + f" ({r['max_abs_loss_diff_vs_ddp']:.1e})"
    ratio = r.get("comm_ratio_vs_ddp")
    tiers = r["comm_bytes_per_step"].get("ring_bytes_sent_all_ranks_by_tier") or {}
    nodes = r.get("nnodes", 1)
    ranks = f"{r['world_size']} ({nodes}x{r['world_size'] // max(nodes, 1)})"
    cells = [
        r["strategy"], ranks, r["precision"], f"{r['step_time_s']:.3f}",
        f"{r['tokens_per_s']['total']:.0f} ({r['tokens_per_s']['per_rank']:.0f})",
        f"{_mib(s['params'])} / {_mib(s['grads'])} / {_mib(s['optimizer'])}", _mib(s["total"]),
        f"{_mib(pred.get('total'))} = {pred.get('formula', pred.get('error', '-'))}",
        "-" if err is None else f"{100 * err:+.2f}%", _mib(r["peak_mem_bytes"].get("rss")),
        _mib(r["comm_bytes_per_step"]["ring_bytes_sent_per_rank"]), "-" if ratio is None else f"{ratio:.3f}",
        _mib(tiers.get("inter_node")) + _predicted_inter(r), parity_text,
    ]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _predicted_inter(r: dict[str, Any]) -> str:
    predicted = r["comm_bytes_per_step"].get("predicted")
    return f" (planned {_mib(predicted['all_ranks_by_tier']['inter_node'])})" if predicted else ""


def _rank_envs(ok: list[dict[str, Any]]) -> str:
    """The first run's rank environment, then each strategy whose own differs (zero_kit.dist: huge pages for
    ZeRO-1/2 of a large model only)."""
    first = ok[0].get("rank_env", {})
    own = [f"{r['strategy']}: {r.get('rank_env', {})}" for r in ok[1:] if r.get("rank_env", {}) != first]
    return f"{first}" + (f" ({'; '.join(own)})" if own else "")


def markdown_table(records: list[dict[str, Any]]) -> str:
    header = (
        "| strategy | ranks (nodes x per node) | precision | step time s (median) | tokens/s total (per rank) |"
        " state MiB/rank params / grads / optim | state MiB/rank measured | predicted MiB = formula |"
        " measured vs predicted (worst rank) | peak RSS MiB (max rank) | comm MiB/step/rank (ring) | comm / DDP |"
        " inter-node MiB/step (all ranks; planned) | loss = DDP (fp32: within 1e-5; bf16/fp16: first 3 steps within 1%) (max diff) |"
    )
    lines = [header, "|" + "---|" * 14]
    lines += [_row(r) for r in records]
    ok = [r for r in records if not r.get("failed")]
    if ok:
        r0 = ok[0]
        model = {k: v for k, v in r0["model"].items() if k not in ("param_numels", "params_held_by_rank")}
        lines += ["", f"Model: {model}; batch: {r0['batch']}; steps {r0['steps']} (warm-up {r0['warmup']}"
                  " excluded from timing and bytes)", f"Versions: {r0['versions']}; hardware: {r0['hardware']};"
                  f" rank environment: {_rank_envs(ok)}"]  # fmt: skip
        differs = [f"{r['strategy']} ({r.get('max_abs_loss_diff_vs_ddp') or 0:.1e})" for r in ok
                   if not r.get("same_arithmetic_as_ddp", True) and not is_user_config(r["strategy"])]  # fmt: skip
        if differs:
            lines += ["", "Not DDP's arithmetic (bf16 master weights, gradients and Adam moments under bf16 autocast), so",
                      f"their losses differ from DDP's by design, max difference measured: {', '.join(differs)}."]  # fmt: skip
        lines += _model_parallel_notes(ok)
        lines += _sequence_parallel_notes(ok)
        lines += table_notes(ok)
        lines += phase_table(records)
        lines += ["", "Measured bytes are read from the live tensors (storages counted once); comm bytes are what one",
                  "rank sends under the ring algorithm for each collective the counting wrapper saw (metrics.py);",
                  "inter-node bytes: every rank's ring bytes to a successor on another node, summed (ring in rank",
                  "order, node = rank // ranks per node)."]  # fmt: skip
    return "\n".join(lines) + "\n"


PHASE_COLUMNS = ("forward", "backward", "reduction", "step", "gather", "alltoall", "other")
"""The phases of the table, in the record's `phases_ms` (zero_kit.bench.phases.PHASES)."""
DS_TIMER_COLUMNS = ("fwd", "bwd", "bwd_allreduce", "step")


def _phase_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _phase_row(r: dict[str, Any]) -> str:
    phases = r["phases_ms"]
    cells = [r["strategy"], f"{1e3 * r['step_time_s']:.1f}"]
    for name in PHASE_COLUMNS:
        cells.append(_phase_cell(phases.get(name)))
    if phases.get("backward") is None:  # one schedule call: forward holds both
        cells[2] += " (fwd+bwd)"
        cells[3] = "in forward"
    total = sum(v for v in phases.values() if v is not None)
    cells.append(f"{100 * total / (1e3 * r['step_time_s']):.0f}%")
    ds = r.get("ds_timers_ms")
    cells.append(" / ".join(_phase_cell(ds.get(n)) for n in DS_TIMER_COLUMNS) if ds else "-")
    return "| " + " | ".join(cells) + " |"


def phase_table(records: list[dict[str, Any]]) -> list[str]:
    """Where each strategy's step goes: each phase's mean over the middle half of the timed steps, rank 0
    (zero_kit.bench.phases, record.phase_means), beside DeepSpeed's own timers of the same steps (ZeRO runs).
    Records written before phases were measured are left out."""
    rows = [r for r in records if not r.get("failed") and r.get("phases_ms")]
    if not rows:
        return []
    return [
        "",
        "Step phases, ms (rank 0, mean over the middle half of the timed steps; step: the median step):",
        "",
        "| strategy | step | forward | backward | reduction | step (optimizer) | gather | all-to-all | other |"
        " sum / step | DeepSpeed timers fwd / bwd / bwd_allreduce / step |",
        "|" + "---|" * 11,
        *[_phase_row(r) for r in rows],
        "",
        "forward, backward and step (optimizer) are the wall time of each call less the collective seconds inside it;",
        "reduction (all-reduce, reduce-scatter, reduce), gather (all-gather, broadcast) and all-to-all (Ulysses'",
        "exchange of attention heads in every layer, the _spN rows) are the seconds the rank was held by collectives,",
        "wherever they fell: what overlap hid behind compute is not in them (DDP's buckets",
        "reduced during backward, ZeRO-3's prefetched gathers), only what was waited for; other is the rest of the",
        "step (the batch moved to the device, the loop). On GPUs NCCL returns at once, so the wait shows in the phase",
        "that synchronizes instead (docs/comparing.md). DeepSpeed's timers include the collectives: fwd + bwd + step",
        "is DeepSpeed's view of the whole step (bwd_allreduce: the boundary reduction inside bwd).",
    ]


def _model_parallel_notes(ok: list[dict[str, Any]]) -> list[str]:
    """Under the table: each tensor/pipeline-parallel run's degrees and a pipeline's measured bubble."""
    lines = []
    for r in ok:
        degrees = r.get("parallel") or {}
        if degrees.get("tensor", 1) * degrees.get("pipeline", 1) == 1:
            continue
        line = f"{r['strategy']}: tensor {degrees['tensor']} x pipeline {degrees['pipeline']} x data {degrees['data']}"
        pipeline = r.get("pipeline")
        if pipeline:
            idle = ", ".join(f"{b:.3f}" for b in pipeline["bubble_by_rank"])
            line += (f"; {pipeline['schedule']}, {pipeline['microbatches']} micro batches: idle per rank {idle}"
                     f" (1 - compute / schedule time) vs (p-1)/(m+p-1) = {pipeline['bubble_theory']:.3f}")  # fmt: skip
        lines.append(line)
    return [""] + lines if lines else []


def plot(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if not r.get("failed")]
    if not ok:
        return []
    names = [r["strategy"] for r in ok]
    paths = []
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(names, [r["tokens_per_s"]["total"] for r in ok], color="tab:blue")
    ax.set_ylabel("tokens/s (all ranks, median step)")
    ax.set_title(f"Throughput, {ok[0]['world_size']} ranks, {ok[0]['precision']}, {ok[0]['device']}")
    ax.tick_params(axis="x", rotation=30)
    paths.append(_save(fig, out_dir / "throughput.png"))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    bottom = [0.0] * len(ok)
    for part, color in (("params", "tab:blue"), ("grads", "tab:orange"), ("optimizer", "tab:green")):
        values = [r["model_state_bytes_per_rank"][part] / 2**20 for r in ok]
        ax1.bar(names, values, bottom=bottom, label=f"{part} (measured)", color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    predicted = [((r["model_state_bytes_per_rank"].get("predicted") or {}).get("total") or 0) / 2**20 for r in ok]
    ax1.scatter(names, predicted, color="black", marker="_", s=600, label="predicted total (accounting.py)", zorder=3)
    ax1.set_ylabel("MiB per rank")
    ax1.set_title("Model-state bytes per rank")
    ax1.legend(fontsize=8)
    ax2.bar(names, [r["peak_mem_bytes"]["rss"] / 2**20 for r in ok], color="tab:gray")
    ax2.set_ylabel("MiB (max over ranks)")
    ax2.set_title("Peak process RSS" if ok[0]["device"] == "cpu" else "Peak memory")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
    paths.append(_save(fig, out_dir / "memory.png"))
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, r in enumerate(ok):
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["strategy"], linestyle=("-", "--", ":")[i % 3])
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean over ranks)")
    ax.set_title("Loss curves (same seed, data order and init)")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / "loss.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_outputs(records: list[dict[str, Any]], out_dir: Path) -> dict[str, Path]:
    annotate(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / "results.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    table = out_dir / "table.md"
    table.write_text(markdown_table(records), encoding="utf-8")
    plots = plot(records, out_dir)
    return {"jsonl": jsonl, "table": table, **{p.stem: p for p in plots}}

"""How `zero-kit plan` shows a plan: a table in GiB with the recommendation, its reasons and one option's term by
term breakdown, or a JSON object in bytes. Formatting only; the numbers come from `zero_kit.plan.memory`."""

from __future__ import annotations

import json
from dataclasses import asdict

from zero_kit.metrics import gib
from zero_kit.plan.assumptions import describe
from zero_kit.plan.memory import Option
from zero_kit.plan.recommend import Plan
from zero_kit.plan.timing import PRECOMPUTE_PAIRS, TERMS, precompute_seconds


def render_text(plan: Plan, label: str) -> str:
    """Header, one row per option (GiB), the recommendation with reasons, and the per-term breakdown."""
    w, hw = plan.work, plan.hardware
    s = w.shape
    tuning = f"LoRA r={w.lora_r} ({w.trainable_params:,} trainable)" if w.lora_r else "full fine-tune"
    if w.preference:
        reference = "the base, adapter off" if w.lora_r else "a frozen copy of the model"
        if w.reference_precomputed:
            reference = "log-probabilities precomputed before training, no model"
        tuning += f", DPO (2 sequences per pair; reference: {reference})"
    lines = [
        f"model: {label}: {w.n_params:,} parameters (h={s.hidden_size}, L={s.layers}, heads={s.heads}/{s.kv_heads} kv,"
        f" I={s.intermediate_size}, V={s.vocab_size})",
        f"run: {w.precision}, {tuning}, seq {w.seq_len} x micro batch {w.micro_batch}, activation checkpointing "
        + ("on" if w.activation_checkpointing else "off")
        + (f", sequence parallel {w.sp} ({w.seq_len // w.sp} tokens per GPU)" if w.sp > 1 else ""),
        f"hardware: {hw.nodes} node(s) x {hw.gpus_per_node} GPU(s) = {hw.world_size} ranks, {gib(hw.gpu_mem)}"
        f" per GPU, {gib(hw.usable_gpu_mem)} usable ({hw.margin:.0%} margin), host RAM "
        + (f"{gib(hw.host_mem)} per node" if hw.host_mem else "not given (unchecked)"),
        "",
        f"{'option':<26}{'fits':<6}{'states':>8}{'activ.':>8}{'buffers':>9}{'total':>8}{'host':>8}{'sent':>8}"
        f"{'inter':>8}  model states formula (per GPU)",
    ]
    for o in plan.options:
        g = o.gpu_bytes()
        fits = "yes" if o.fits else ("host" if o.fits_gpu else "no")
        mark = "*" if o is plan.recommended else " "
        lines.append(
            f"{mark}{o.label:<25}{fits:<6}{gib(g['model_states'], unit=False):>8}{gib(g['activations'], unit=False):>8}"
            f"{gib(g['buffers'], unit=False):>9}{gib(g['total'], unit=False):>8}{gib(o.host_bytes, unit=False):>8}{gib(o.comm_bytes_per_step, unit=False):>8}"
            f"{gib(o.inter_node_bytes_per_node, unit=False):>8}  {o.states_formula}"
        )
    lines.append(
        "GiB per GPU; host = RAM per node; sent = bytes each rank sends per step; inter = ring bytes each node sends"
        " to other nodes per step (zero_kit.plan.traffic); fits: host = GPU yes, host RAM no; +tpT/+ppP: tensor/pipeline"
        " parallel layout over the row's data parallelism, its fullest rank (zero_kit.plan.parallel; Ψr = that rank's"
        " parameters, N_dp = N / (tp x pp))"
    )
    if plan.rates is not None:
        lines += ["", *time_table(plan)]
    if plan.longest is not None:
        lines += ["", *longest_table(plan)]
    lines.append("")
    lines.append(f"recommended: {plan.recommended.label}" if plan.recommended else "refused: nothing fits")
    lines += [f"  - {reason}" for reason in plan.reasons]
    shown = plan.recommended or min(plan.options, key=lambda o: o.gpu_bytes()["total"])
    lines += ["", *breakdown(shown), "  " + describe(plan.hardware.assume)]
    return "\n".join(lines)


def longest_table(plan: Plan) -> list[str]:
    """`--longest`: each data-parallel option's longest fitting sequence and the two largest terms there."""
    w = plan.work
    lines = [f"longest sequence that fits (micro batch {w.micro_batch}, these flags, in steps of sp {w.sp}):",
             f"  {'option':<26}{'tokens':>12}  largest terms there"]  # fmt: skip
    for longest in plan.longest:
        tokens = f"{longest.seq_len:,}" if longest.seq_len else "none"
        lines.append(f"  {longest.label:<26}{tokens:>12}  {', '.join(longest.limit_terms)}")
    return lines


def time_table(plan: Plan) -> list[str]:
    """Predicted seconds per step per option: the total, tokens/s, each term and the dominant one."""
    rates = plan.rates
    lines = [
        "predicted step time:",
        f"  {'option':<26}{'step s':>9}{'tokens/s':>11}{'compute':>9}{'intra':>9}{'inter':>9}{'offload':>9}"
        f"{'overhead':>9}{'hidden':>9}  dominant",
    ]
    for o in plan.options:
        t = o.timing
        mark = "*" if o is plan.recommended else " "
        terms = "".join(f"{t.terms[name]:>9.3g}" for name in TERMS)
        lines.append(
            f"  {mark}{o.label:<25}{t.step_s:>9.3g}{t.tokens_per_s:>11,.0f}{terms}{t.hidden_s:>9.3g}  {t.dominant}"
        )
    lines.append(
        f"  seconds per step (one micro batch); step = compute + comm - hidden + offload + overhead not hidden by link waits. compute: "
        f"{rates.compute_source}; collectives: {rates.comm_backend};"
        f" intra-node {rates.intra_bytes_per_s * 8 / 1e9:g} Gbit/s per GPU, inter-node"
        f" {rates.inter_bytes_per_s * 8 / 1e9:g} Gbit/s per node, {rates.latency_s * 1e6:g} us per collective call,"
        f" {rates.overlap:.0%} of overlappable comm hidden (ring model: zero_kit.plan.timing)"
    )
    if plan.work.preference and plan.work.reference_precomputed:
        seconds = precompute_seconds(plan.work, plan.hardware.world_size, rates)
        lines.append(
            f"  DPO reference precomputed before training: {seconds:.3g} s per {PRECOMPUTE_PAIRS:,} pairs on"
            f" {plan.hardware.world_size} GPU(s) (one forward of the starting model per pair, once; a run with the"
            " reference model spends that on each pair every time it reads it)"
        )
    return lines


def breakdown(option: Option) -> list[str]:
    """Every term of one option with its formula (Ψ parameters, N ranks, b micro batch, s sequence)."""
    lines = [f"breakdown for {option.label} (per GPU unless marked host):", f"  {'term':<56}{'GiB':>8}  formula"]
    groups = (("model states", option.states), ("activations", option.activations), ("buffers", option.buffers))
    for group, terms in (*groups, ("host RAM per node", option.host)):
        for name, (value, formula) in terms.items():
            lines.append(f"  {group + ': ' + name:<56}{gib(value, unit=False):>8}  {formula}")
    lines.append(f"  {'total per GPU':<56}{gib(option.gpu_bytes()['total'], unit=False):>8}")
    lines.append(
        "  assumed: SDPA/flash attention (no s² scores kept), logits upcast to fp32 for the loss, AdamW with fp32"
        " states, DeepSpeed 0.19.8 buffers; the constants below are stated, not measured"
    )
    return lines


def option_json(option: Option) -> dict:
    return {
        "name": option.info.name,
        "strategy": option.strategy,
        "offload": option.offload,
        "label": option.label,
        "fits": option.fits,
        "fits_gpu": option.fits_gpu,
        "fits_host": option.fits_host,
        "gpu_bytes": option.gpu_bytes(),
        "host_bytes": option.host_bytes,
        "comm_bytes_per_step": option.comm_bytes_per_step,
        "ring_bytes_per_step_all_ranks": {
            "intra_node": option.traffic.intra_node,
            "inter_node": option.traffic.inter_node,
        },
        "inter_node_bytes_per_node_per_step": option.inter_node_bytes_per_node,
        "model_states_formula": option.states_formula,
        "layout": asdict(option.layout) if option.layout else None,
        "timing": timing_json(option) if option.timing is not None else None,
        "terms": {
            group: {name: {"bytes": value, "formula": formula} for name, (value, formula) in terms.items()}
            for group, terms in (
                ("model_states", option.states),
                ("activations", option.activations),
                ("buffers", option.buffers),
                ("host", option.host),
            )
        },
    }


def timing_json(option: Option) -> dict:
    t = option.timing
    return {
        "step_time_s": t.step_s,
        "tokens_per_s": t.tokens_per_s,
        "dominant": t.dominant,
        "seconds": {name.replace(" ", "_").replace("-", "_"): t.terms[name] for name in TERMS}
        | {
            "hidden_comm": t.hidden_s,
            "pcie": t.pcie_s,
            "cpu_adam": t.cpu_adam_s,
            "overhead_hidden": t.overhead_hidden_s,
            "pipeline_bubble": t.bubble_s,
        },
        "phases_s": t.phases,
        "collectives": [
            {
                "what": c.collective.what,
                "kind": c.collective.kind,
                "payload_bytes": c.collective.payload,
                "calls": c.collective.calls,
                "ring_bytes_sent_per_gpu": c.ring_bytes,
                "intra_node_s": c.intra_s,
                "inter_node_s": c.inter_s,
                "latency_s": c.latency_s,
                "tier": c.tier,
                "group": c.collective.group,
                "overlappable": c.collective.overlappable,
            }
            for c in t.comms
        ],
    }


def render_json(plan: Plan, label: str) -> str:
    """The whole plan as a JSON object, every size in bytes."""
    best = plan.recommended
    document = {
        "model": {"label": label, "n_params": plan.work.n_params, "shape": asdict(plan.work.shape)},
        "run": {
            "precision": plan.work.precision,
            "seq_len": plan.work.seq_len,
            "micro_batch": plan.work.micro_batch,
            "lora_r": plan.work.lora_r,
            "activation_checkpointing": plan.work.activation_checkpointing,
            "method": "dpo" if plan.work.preference else "sft",
            "dpo_reference": ("precompute" if plan.work.reference_precomputed else "model")
            if plan.work.preference
            else None,
        },
        "hardware": asdict(plan.hardware) | {"world_size": plan.hardware.world_size},
        "units": "bytes",
        "options": [option_json(o) for o in plan.options],
        "recommended": {"strategy": best.strategy, "offload": best.offload, "label": best.label} if best else None,
        "reasons": plan.reasons,
        "rank_by": plan.rank_by,
        "rates": asdict(plan.rates) if plan.rates is not None else None,
    }
    if plan.work.preference and plan.work.reference_precomputed and plan.rates is not None:
        seconds = precompute_seconds(plan.work, plan.hardware.world_size, plan.rates)
        document["run"]["dpo_precompute_s_per_1000_pairs"] = seconds * 1000 / PRECOMPUTE_PAIRS
    if plan.longest is not None:
        document["longest"] = [asdict(longest) for longest in plan.longest]
    return json.dumps(document, indent=2)

"""How `zero-kit plan` shows a plan: a table in GiB with the recommendation, its reasons and one option's term by
term breakdown, or a JSON object in bytes. Formatting only; the numbers come from `zero_kit.plan.memory`."""

from __future__ import annotations

import json
from dataclasses import asdict

from zero_kit.plan.memory import Option
from zero_kit.plan.recommend import Plan


def _gib(value: int) -> str:
    return f"{value / 2**30:.1f}"


def render_text(plan: Plan, label: str) -> str:
    """Header, one row per option (GiB), the recommendation with reasons, and the per-term breakdown."""
    w, hw = plan.work, plan.hardware
    s = w.shape
    tuning = f"LoRA r={w.lora_r} ({w.trainable_params:,} trainable)" if w.lora_r else "full fine-tune"
    lines = [
        f"model: {label}: {w.n_params:,} parameters (h={s.hidden_size}, L={s.layers}, heads={s.heads}/{s.kv_heads} kv,"
        f" I={s.intermediate_size}, V={s.vocab_size})",
        f"run: {w.precision}, {tuning}, seq {w.seq_len} x micro batch {w.micro_batch}, activation checkpointing "
        + ("on" if w.activation_checkpointing else "off"),
        f"hardware: {hw.nodes} node(s) x {hw.gpus_per_node} GPU(s) = {hw.world_size} ranks, {_gib(hw.gpu_mem)} GiB"
        f" per GPU, {_gib(hw.usable_gpu_mem)} GiB usable ({hw.margin:.0%} margin), host RAM "
        + (f"{_gib(hw.host_mem)} GiB per node" if hw.host_mem else "not given (unchecked)"),
        "",
        f"{'option':<26}{'fits':<6}{'states':>8}{'activ.':>8}{'buffers':>9}{'total':>8}{'host':>8}{'sent':>8}"
        "  model states formula (per GPU)",
    ]
    for o in plan.options:
        g = o.gpu_bytes()
        fits = "yes" if o.fits else ("host" if o.fits_gpu else "no")
        mark = "*" if o is plan.recommended else " "
        lines.append(
            f"{mark}{o.label:<25}{fits:<6}{_gib(g['model_states']):>8}{_gib(g['activations']):>8}"
            f"{_gib(g['buffers']):>9}{_gib(g['total']):>8}{_gib(o.host_bytes):>8}{_gib(o.comm_bytes_per_step):>8}"
            f"  {o.states_formula}"
        )
    lines.append(
        "GiB per GPU; host = RAM per node; sent = bytes each rank sends per step; fits: host = GPU yes, host RAM no"
    )
    lines.append("")
    lines.append(f"recommended: {plan.recommended.label}" if plan.recommended else "refused: nothing fits")
    lines += [f"  - {reason}" for reason in plan.reasons]
    shown = plan.recommended or min(plan.options, key=lambda o: o.gpu_bytes()["total"])
    lines += ["", *breakdown(shown)]
    return "\n".join(lines)


def breakdown(option: Option) -> list[str]:
    """Every term of one option with its formula (Ψ parameters, N ranks, b micro batch, s sequence)."""
    lines = [f"breakdown for {option.label} (per GPU unless marked host):", f"  {'term':<56}{'GiB':>8}  formula"]
    groups = (("model states", option.states), ("activations", option.activations), ("buffers", option.buffers))
    for group, terms in (*groups, ("host RAM per node", option.host)):
        for name, (value, formula) in terms.items():
            lines.append(f"  {group + ': ' + name:<56}{_gib(value):>8}  {formula}")
    lines.append(f"  {'total per GPU':<56}{_gib(option.gpu_bytes()['total']):>8}")
    lines.append(
        "  assumed: SDPA/flash attention (no s² scores kept), logits upcast to fp32 for the loss, AdamW with fp32"
        " states, DeepSpeed 0.19.8 buffers; CUDA context + NCCL 1 GiB and allocator slack 5% are stated, not measured"
    )
    return lines


def option_json(option: Option) -> dict:
    return {
        "strategy": option.strategy,
        "offload": option.offload,
        "label": option.label,
        "fits": option.fits,
        "fits_gpu": option.fits_gpu,
        "fits_host": option.fits_host,
        "gpu_bytes": option.gpu_bytes(),
        "host_bytes": option.host_bytes,
        "comm_bytes_per_step": option.comm_bytes_per_step,
        "model_states_formula": option.states_formula,
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
        },
        "hardware": asdict(plan.hardware) | {"world_size": plan.hardware.world_size},
        "units": "bytes",
        "options": [option_json(o) for o in plan.options],
        "recommended": {"strategy": best.strategy, "offload": best.offload, "label": best.label} if best else None,
        "reasons": plan.reasons,
    }
    return json.dumps(document, indent=2)

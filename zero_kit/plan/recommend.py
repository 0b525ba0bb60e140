"""The recommendation of `zero-kit plan`: rank the options `zero_kit.plan.memory` evaluated (fits, then expected
speed), explain the choice in plain words, or, when nothing fits, say what is short and which change would fit."""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_kit.metrics import gib
from zero_kit.plan.memory import PLANNED, Hardware, Option, Workload, evaluate, evaluate_all
from zero_kit.plan.parallel import Layout
from zero_kit.plan.parallel_options import default_layouts, evaluate_layout, layout_reasons, layout_step_time
from zero_kit.plan.rates import Rates
from zero_kit.plan.timing import step_time

SLOW_LINK_GBPS = 100.0  # below this, inter-node bytes dominate step time more than offload does


def slow_link(hardware: Hardware) -> bool:
    return hardware.nodes > 1 and hardware.inter_node_gbps is not None and hardware.inter_node_gbps < SLOW_LINK_GBPS


def speed_key(option: Option, hardware: Hardware) -> tuple:
    """Expected fastest first: no offload before offload (PCIe copies and CPU Adam cost more than collectives on a
    fast fabric), then full-precision states before bf16 ones (their updates round to bf16: taken only when
    they save offload), then fewer bytes sent per step, then fewer GPU bytes (room for larger micro batches).
    On a slow inter-node link the bytes each node sends over it come first (zero_kit.plan.traffic: hpZ and HSDP
    keep their parameter all-gathers inside the node; a pipeline stage per node sends only activations), then the
    bytes sent per rank."""
    offload = int(option.info.offload_optimizer) + int(option.info.offload_param)
    low = int(option.info.low_precision_states)
    total = option.gpu_bytes()["total"]
    # A tensor/pipeline layout pays its activation traffic and bubble, which bytes per rank do not show: on a fast
    # fabric it ranks after data parallelism without offload, before offload (zero_kit.plan.parallel_options).
    split = int(option.layout is not None)
    if slow_link(hardware):
        return (option.inter_node_bytes_per_node, offload, split, low, option.comm_bytes_per_step, total)
    return (offload, split, low, option.comm_bytes_per_step, total)


def recommend(options: list[Option], hardware: Hardware, rank_by: str = "memory") -> Option | None:
    """The fitting option expected fastest: by `speed_key` ("memory": the memory model's proxies), or by the
    predicted step time ("time", needs each option's `timing`)."""
    fitting = [o for o in options if o.fits]
    if not fitting:
        return None
    if rank_by == "time":
        return min(fitting, key=lambda o: (o.timing.step_s, speed_key(o, hardware)))
    return min(fitting, key=lambda o: speed_key(o, hardware))


@dataclass
class Plan:
    work: Workload
    hardware: Hardware
    options: list[Option]
    recommended: Option | None
    reasons: list[str]
    rates: Rates | None = None
    rank_by: str = "memory"
    longest: list[Longest] | None = None
    """`zero-kit plan --longest`: every data-parallel option's longest fitting sequence."""


def make_plan(
    work: Workload,
    hardware: Hardware,
    rates: Rates | None = None,
    rank_by: str = "memory",
    layouts: list[Layout] | None = None,
) -> Plan:
    """Every option's memory (and, with `rates`, step time), the recommendation and its reasons. `layouts`: the
    tensor/pipeline-parallel layouts to plan beside the data-parallel options (None: `default_layouts`)."""
    if rank_by not in ("memory", "time"):
        raise ValueError(f"rank_by must be 'memory' or 'time', got {rank_by!r}")
    if rank_by == "time" and rates is None:
        raise ValueError("ranking by time needs rates")
    layouts = default_layouts(work, hardware) if layouts is None else layouts
    options = evaluate_all(work, hardware) + [evaluate_layout(layout, work, hardware) for layout in layouts]
    if rates is not None:
        for option in options:
            option.timing = (
                layout_step_time(option, work, hardware, rates)
                if option.layout
                else step_time(option.info, work, hardware, rates)
            )
    best = recommend(options, hardware, rank_by)
    reasons = explain(best, options, work, hardware) if best else refusal(options, work, hardware)
    if best and rank_by == "time":
        reasons = [*reasons[:-1], _time_reason(best, options)]
    if best:
        reasons[-1:-1] = layout_reasons(best, options, work, hardware)
    return Plan(work, hardware, options, best, reasons, rates, rank_by)


@dataclass(frozen=True)
class Longest:
    """The longest sequence a data-parallel option fits at the run's micro batch and flags (a multiple of sp)."""

    label: str
    seq_len: int
    """0: not even sp tokens fit."""
    limit_terms: tuple[str, ...]
    """The largest GPU terms at that length: what sets the limit."""


LONGEST_LIMIT = 1 << 24
"""The search stops at 16M tokens."""


def longest_sequences(work: Workload, hardware: Hardware) -> list[Longest]:
    """For every data-parallel option, the longest --seq-len (in steps of sp) whose plan fits: the memory of a
    sequence only grows with its length, so a binary search over the planner's own evaluation finds it."""
    step, found = work.sp, []
    for info in PLANNED:

        def at(units: int, info=info) -> Option:
            return evaluate(info, replace(work, seq_len=units * step), hardware)

        low, high = 0, LONGEST_LIMIT // step  # at(low) fits (or low is 0); at(high + 1) is past the search
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if at(middle).fits else (low, middle - 1)
        option = at(max(low, 1))
        terms = {**option.states, **option.activations, **option.buffers}
        largest = sorted(terms, key=lambda name: -terms[name][0])[:2]
        found.append(Longest(option.label, low * step, tuple(largest)))
    return found


def _time_reason(best: Option, options: list[Option]) -> str:
    runner_up = sorted((o for o in options if o.fits and o is not best), key=lambda o: o.timing.step_s)
    versus = f", against {runner_up[0].timing.step_s:.3g} s for {runner_up[0].label}" if runner_up else ""
    return (
        f"Ranking by predicted step time (--rank-by time): {best.label} takes {best.timing.step_s:.3g} s per step"
        f" ({best.timing.dominant} dominates){versus}."
    )


def _by_label(options: list[Option]) -> dict[str, Option]:
    return {o.label: o for o in options}


def explain(best: Option, options: list[Option], work: Workload, hardware: Hardware) -> list[str]:
    """Plain-words reasons for the recommendation."""
    total = best.gpu_bytes()["total"]
    reasons = [
        f"{best.label} needs {gib(total)} per GPU of {gib(hardware.usable_gpu_mem)} usable "
        f"({gib(hardware.gpu_mem)} less a {hardware.margin:.0%} margin), {gib(hardware.usable_gpu_mem - total)} spare.",
        _why(best, _by_label(options)),
    ]
    if slow_link(hardware):
        reasons.append(_slow_link_reason(best, options, hardware))
    if best.info.low_precision_states:
        reasons.append(
            f"{best.label} keeps master weights, gradients and Adam moments in bf16 (10 bytes per parameter instead"
            " of 18; DeepSpeed's bf16_master_weights_and_grads + bf16_optimizer_states): it avoids offload, but"
            " its updates round to bf16, so compare its loss curve with an fp32-master run."
        )
    reasons += _host_warnings(options, hardware)
    reasons.append(
        "Ranking: fits with the margin; then no offload before offload; then data parallelism alone before"
        " tensor/pipeline layouts; then fp32 master states before bf16 ones;"
        " then fewer bytes sent per step; then fewer GPU bytes (room for a larger micro batch)."
    )
    return reasons


def _slow_link_reason(best: Option, options: list[Option], hardware: Hardware) -> str:
    flat = [o for o in options if o.fits and o.info.hierarchy == "flat" and o is not best]
    versus = min(flat, key=lambda o: o.inter_node_bytes_per_node, default=None)
    than = f", against {gib(versus.inter_node_bytes_per_node)} for {versus.label}" if versus else ""
    return (
        f"The inter-node link ({hardware.inter_node_gbps:g} Gbit/s) is slow, so options sending fewer bytes over it"
        f" per step rank first, even before avoiding offload: {best.label} sends"
        f" {gib(best.inter_node_bytes_per_node)} per node per step between nodes{than}."
    )


def _why(best: Option, by: dict[str, Option]) -> str:
    sent = f"sends {gib(best.comm_bytes_per_step)} per step"
    if best.offload == "none" and best.strategy in ("ddp", "zero0", "zero1", "zero2") and "zero3" in by:
        return (
            f"The parameters fit on every GPU unsharded, so no parameter all-gathers are needed: {best.label} "
            f"{sent}, against {gib(by['zero3'].comm_bytes_per_step)} for ZeRO-3 and "
            f"{gib(by['ddp'].comm_bytes_per_step)} for DDP (which all-reduces fp32 gradients)."
        )
    unsharded = [by[name] for name in ("ddp", "zero0", "zero1", "zero2") if name in by]
    if best.offload == "none" and any(o.fits for o in unsharded):
        fitting = min((o for o in unsharded if o.fits), key=lambda o: o.gpu_bytes()["total"])
        return (
            f"{fitting.label} would fit with unsharded parameters, but {best.label} sends fewer bytes between nodes"
            " per step (below), which matters more on a slow link."
        )
    if best.offload == "none":
        smallest = min(o.gpu_bytes()["total"] for o in unsharded)
        return (
            "DDP and ZeRO-0/1/2 keep a full copy of the parameters on every GPU and do not fit (the smallest of them "
            f"needs {gib(smallest)}), so parameters must be sharded: {best.label} gathers them in forward and "
            f"backward and {sent}."
        )
    fitting = sorted((o for o in by.values() if o.fits and o.offload == "none"), key=lambda o: o.comm_bytes_per_step)
    lead = (
        f"{fitting[0].label} fits without offload but sends {gib(fitting[0].comm_bytes_per_step)} per step; "
        if fitting
        else "Nothing fits in GPU memory without offload; "
    )
    moved = "optimizer states and parameters" if "param" in best.offload else "optimizer states"
    return (
        f"{lead}offloading moves {moved} to host RAM ({gib(best.host_bytes)} per node), paid for by PCIe copies every"
        " step and Adam on the CPU: expect much slower steps than without offload."
    )


def _host_warnings(options: list[Option], hardware: Hardware) -> list[str]:
    short = [o for o in options if o.fits_gpu and o.fits_host is False and o.offload != "none"]
    if not short:
        return []
    o = min(short, key=lambda x: x.host_bytes)
    return [
        f"Host RAM too small for offload: {o.label} would fit the GPUs but needs {gib(o.host_bytes)} of host RAM"
        f" per node, {gib(o.host_bytes - (hardware.host_mem or 0))} more than the {gib(hardware.host_mem or 0)} given."
    ]


def refusal(options: list[Option], work: Workload, hardware: Hardware) -> list[str]:
    """Nothing fits: what is short, by how much, and what would fit instead."""
    closest = min(options, key=lambda o: o.gpu_bytes()["total"])
    need = closest.gpu_bytes()["total"]
    lines = [
        f"Nothing fits. The smallest option, {closest.label}, needs {gib(need)} per GPU; "
        f"{gib(hardware.usable_gpu_mem)} is usable, short by {gib(need - hardware.usable_gpu_mem)}."
    ]
    lines += _host_warnings(options, hardware)
    lines += [f"Would fit: {alternative}" for alternative in alternatives(work, hardware)]
    return lines


def alternatives(work: Workload, hardware: Hardware) -> list[str]:
    """Changes to the hardware or the run that would make some option fit (the first that works of each kind). A long
    sequence's own remedies come first: they keep the run on its GPUs (DeepSpeed's ALST, docs/long_sequences.md)."""
    from zero_kit.lint.rules_ulysses import sp_sizes

    shape = work.shape
    tries = [
        [
            (f"--sp {sp}", replace(work, sp=sp), hardware)
            for sp in sp_sizes(shape.heads, shape.kv_heads, work.seq_len, hardware.gpus_per_node, above=work.sp)
        ],
        [("--tiled-compute", replace(work, tiled=True), hardware)] if not work.tiled else [],
        [
            (
                f"{hardware.nodes * k} nodes of {hardware.gpus_per_node} GPUs",
                work,
                replace(hardware, nodes=hardware.nodes * k),
            )
            for k in (2, 4, 8, 16, 32, 64, 128)
        ],
        [
            (f"GPUs with {gb} GB each ({hardware.world_size} of them)", work, replace(hardware, gpu_mem=gb * 10**9))
            for gb in (24, 40, 48, 80, 94, 141, 192)
            if gb * 10**9 > hardware.gpu_mem
        ],
        [("--activation-checkpointing", replace(work, activation_checkpointing=True), hardware)]
        if not work.activation_checkpointing
        else [],
        [("--micro-batch 1", replace(work, micro_batch=1), hardware)] if work.micro_batch > 1 else [],
        [("LoRA (--lora-r 16)", replace(work, lora_r=16), hardware)] if not work.lora_r else [],
        [("more host RAM", work, replace(hardware, host_mem=None))] if hardware.host_mem is not None else [],
    ]
    found = []
    for kind in tries:
        for text, changed_work, changed_hardware in kind:
            option = recommend(evaluate_all(changed_work, changed_hardware), changed_hardware)
            if option:
                found.append(
                    f"{text} with {option.label} ({gib(option.gpu_bytes()['total'])} per GPU, {gib(option.host_bytes)} host RAM per node)"
                )
                break
    if not found and not work.activation_checkpointing:  # two changes: checkpointing plus one of the others
        both = alternatives(replace(work, activation_checkpointing=True), hardware)
        found = [f"--activation-checkpointing and {text}" for text in both if not text.startswith("no tried")]
    return found or [
        "no tried change (--sp within a node, tiled compute, up to 128x the nodes, 192 GB GPUs, checkpointing, LoRA r=16)"
        " is enough"
    ]

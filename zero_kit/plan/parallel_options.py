"""Tensor- and pipeline-parallel layouts as options of `zero-kit plan`: which layouts are tried, each one's memory
(`zero_kit.plan.parallel`'s states and activations, `zero_kit.plan.memory`'s buffers and host terms), its step time
and the words that say why it wins or loses.

Layouts tried unless --tp/--pp name them (the decision guide: tensor parallel only inside a node, a pipeline across
the slow link): tp = the largest divisor of the heads and the world that fits in one node (tp >= 2), pp = one stage
per node (nodes >= 2), and both; over ZeRO-1, and over FSDP2 where data-parallel ranks remain. Every layout trains the same
global batch as the flat options (b x s tokens per rank): each replica runs m = tp x pp micro batches of b per step
unless --pp-micro-batches says otherwise.

Step time: compute = the flat model's time for m micro batches / (tp x pp), stretched by the pipeline's idle slots
(m + p - 1)/m (`parallel.bubble_fraction`); tp and pp traffic is on the critical path (not overlapped: AutoTP's
all-reduces block, tp_overlap_comm is off; a stage waits for its input), the data-parallel sync overlaps as the
flat option's does.
"""

from __future__ import annotations

from dataclasses import replace

from zero_kit.errors import UserError
from zero_kit.metrics import gib
from zero_kit.plan.memory import Hardware, Option, _state_terms, _sum, buffer_terms, host_terms
from zero_kit.plan.parallel import (
    Layout,
    bubble_fraction,
    layout_problems,
    parallel_activation_terms,
    parallel_collectives,
    parallel_state_bytes,
    stage_params,
)
from zero_kit.plan.rates import Rates
from zero_kit.plan.timing import TERMS, StepTime, comm_time, compute_seconds
from zero_kit.plan.traffic import TierBytes, tier_bytes
from zero_kit.plan.workload import Workload
from zero_kit.strategies import STRATEGIES

GUIDE_MICRO_BATCHES_PER_STAGE = 4  # the seeds' rule of thumb: at least 4 micro batches per pipeline stage


def default_layouts(work: Workload, hardware: Hardware, micro_batches: int | None = None) -> list[Layout]:
    """The layouts the plan tries without --tp/--pp (module doc); none on one GPU or for a LoRA run."""
    if work.lora_r or hardware.world_size < 2:
        return []
    shape, world, per_node = work.shape, hardware.world_size, hardware.gpus_per_node
    tp = max((d for d in range(2, per_node + 1) if shape.heads % d == 0 and world % d == 0), default=1)
    pp = hardware.nodes if 1 < hardware.nodes <= shape.layers else 1
    shapes = [(tp, 1)] if tp > 1 else []
    shapes += [(1, pp)] if pp > 1 else []
    shapes += [(tp, pp)] if tp > 1 and pp > 1 and world % (tp * pp) == 0 else []
    layouts = [_layout(t, p, "zero1", micro_batches) for t, p in shapes]
    # FSDP2 over each layout's data-parallel group (DTensor TP on a 2D mesh; FSDP inside each pipeline stage)
    layouts += [_layout(t, p, "fsdp", micro_batches) for t, p in shapes if world > t * p]
    return layouts


def _layout(tp: int, pp: int, base: str, micro_batches: int | None) -> Layout:
    return Layout(tp=tp, pp=pp, micro_batches=micro_batches or tp * pp, base=base)


def chosen_layouts(work: Workload, hardware: Hardware, tp: int, pp: int, micro_batches: int | None) -> list[Layout]:
    """--tp/--pp: that layout over ZeRO-1 (and FSDP2 where dp ranks remain); ValueError naming what does not fit."""
    layouts = [_layout(tp, pp, "zero1", micro_batches)]
    layouts += [_layout(tp, pp, "fsdp", micro_batches)] if hardware.world_size > tp * pp else []
    problems = layout_problems(layouts[0], work.shape, hardware.world_size)
    if work.lora_r:
        problems.append("LoRA with tensor or pipeline parallelism is not planned")
    if problems:
        raise ValueError("; ".join(problems))
    return layouts


def layouts_from_flags(
    tp: int | None, pp: int | None, micro_batches: int | None, model_parallel: bool, work: Workload, hardware: Hardware
) -> list[Layout] | None:
    """The layouts `zero-kit plan`'s flags ask for: None (the defaults), none (--no-model-parallel), or the one
    --tp/--pp name; every bad combination is a UserError naming the flags."""
    named = (("--tp", tp), ("--pp", pp), ("--pp-micro-batches", micro_batches))
    given = {flag: value for flag, value in named if value is not None}
    for flag, value in given.items():
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}", f"pass {flag} 1 or more, or leave it out")
    if not model_parallel:
        if given:
            raise UserError(f"--no-model-parallel with {', '.join(given)}", "give one: layouts or none")
        return []
    if tp is None and pp is None:
        return None if micro_batches is None else default_layouts(work, hardware, micro_batches)
    tp, pp = tp or 1, pp or 1
    if tp * pp < 2:
        raise UserError("--tp 1 --pp 1 is data parallelism alone", "use --no-model-parallel, or a size of 2 or more")
    try:
        return chosen_layouts(work, hardware, tp, pp, micro_batches)
    except ValueError as err:
        raise UserError(f"--tp {tp} --pp {pp}: {err}", "pick sizes that divide the heads and the GPUs") from None


def evaluate_layout(layout: Layout, work: Workload, hardware: Hardware) -> Option:
    """One layout's memory per GPU (its fullest rank), host RAM and traffic, as an Option beside the flat ones."""
    world = hardware.world_size
    dp = layout.dp(world)
    states = parallel_state_bytes(work, layout, world)
    gpu_states, _, formula = _state_terms(states)
    rank_work = replace(work, n_params=max(stage_params(work.shape, layout.tp, layout.pp)))
    buffers = buffer_terms(layout.base, "none", rank_work, dp, hardware.assume.cuda_context_bytes)
    activations = parallel_activation_terms(work, layout)
    slack_rate = (
        hardware.assume.zero_allocator_slack if layout.base.startswith("zero") else hardware.assume.allocator_slack
    )
    slack_base = _sum(gpu_states) + _sum(activations) + _sum(buffers)
    buffers["allocator slack"] = (int(slack_base * slack_rate), f"{slack_rate:.0%} of the rest")
    collectives = parallel_collectives(work, layout, world)
    traffic = TierBytes()
    for c in collectives:
        traffic += tier_bytes(c, hardware.nodes, hardware.gpus_per_node)
    option = Option(
        STRATEGIES[layout.base],
        gpu_states,
        activations,
        buffers,
        host_terms(layout.base, {}, work, hardware),
        int(traffic.per_rank),
        formula,
        traffic=traffic,
        nodes=hardware.nodes,
        layout=layout,
    )
    option.fits_gpu = option.gpu_bytes()["total"] <= hardware.usable_gpu_mem
    if hardware.host_mem is not None:
        option.fits_host = option.host_bytes <= hardware.host_mem
    return option


def layout_step_time(option: Option, work: Workload, hardware: Hardware, rates: Rates) -> StepTime:
    """Predicted seconds per step of a layout option (module doc)."""
    return parallel_step_time(option.layout, work, hardware, rates)


def parallel_step_time(
    layout: Layout, work: Workload, hardware: Hardware, rates: Rates, overhead_s: float = 0.0
) -> StepTime:
    """Predicted seconds per step of `layout` (module doc); `overhead_s`: a calibrated framework overhead per step
    (zero_kit.plan.calibration), overlapping the link waits as a flat strategy's does (zero_kit.plan.timing)."""
    m, model_ranks = layout.micro_batches, layout.tp * layout.pp
    ideal = compute_seconds(work, rates) * m / model_ranks
    compute = ideal * (m + layout.pp - 1) / m
    comms = [comm_time(c, hardware, rates) for c in parallel_collectives(work, layout, hardware.world_size)]
    overlappable = sum(c.seconds for c in comms if c.collective.overlappable)
    hidden = min(rates.overlap * overlappable, ideal)
    terms = dict.fromkeys(TERMS, 0.0)
    terms["compute"] = compute
    for c in comms:
        terms[c.tier] += c.seconds
    terms["overhead"] = overhead_s
    tokens = work.micro_batch * work.seq_len * m * layout.dp(hardware.world_size)
    return StepTime(compute, comms, hidden, overhead_s=overhead_s, tokens_per_step=tokens, terms=terms,
                    bubble_s=compute - ideal)  # fmt: skip


def layout_reasons(best: Option, options: list[Option], work: Workload, hardware: Hardware) -> list[str]:
    """Why model parallelism wins or loses here, in numbers (the decision guide: pipeline bubbles below ~4
    micro batches per stage; tensor parallel only inside a node)."""
    layouts = sorted((o for o in options if o.layout is not None), key=lambda o: o is not best)
    if not layouts:
        return []
    lines = [_tp_reason(o, hardware) for o in layouts if o.layout.tp > 1 and o.layout.pp == 1][:1]
    lines += [_pp_reason(o, best, hardware) for o in layouts if o.layout.pp > 1][:1]
    flat = [o for o in options if o.layout is None and o.fits]
    if best.layout is not None and not flat:
        lines.append(
            f"No data-parallel option fits alone; {best.label} fits by splitting the model itself"
            f" ({gib(best.gpu_bytes()['total'])} per GPU)."
        )
    elif best.layout is None:
        fitting = [o for o in layouts if o.fits]
        lines.append(
            f"Model parallelism is not needed: {best.label} fits without splitting the model"
            + (
                f", and the best layout, {min(fitting, key=lambda o: _key(o)).label}, adds its own traffic"
                if fitting
                else " (no tensor/pipeline layout fits either)"
            )
            + "."
        )
    return lines


def _key(option: Option) -> float:
    return option.timing.step_s if option.timing is not None else option.comm_bytes_per_step


def _tp_reason(option: Option, hardware: Hardware) -> str:
    layout = option.layout
    inside = layout.tp <= hardware.gpus_per_node
    where = (
        "inside one node (its all-reduces stay on NVLink)"
        if inside
        else "across nodes: every layer waits on the network"
    )
    tp_bytes = sum(c.ring_bytes for c in (option.timing.comms if option.timing else []) if c.collective.group == "tp")
    sent = f", {gib(tp_bytes)} per GPU per step in 7 all-reduces per layer and micro batch" if tp_bytes else ""
    return (
        f"{option.label}: tensor parallel over {layout.tp} GPUs {where}; it divides the block weights' states by"
        f" {layout.tp} ({gib(option.gpu_bytes()['model_states'])} of states per GPU){sent}."
    )


def _pp_reason(option: Option, best: Option, hardware: Hardware) -> str:
    layout = option.layout
    bubble = bubble_fraction(layout.pp, layout.micro_batches)
    wanted = GUIDE_MICRO_BATCHES_PER_STAGE * layout.pp
    verdict = (
        f"fewer than the {wanted} (4 x {layout.pp} stages) that keep it small: --pp-micro-batches {wanted} would idle"
        f" {bubble_fraction(layout.pp, wanted):.0%}, at {wanted / layout.micro_batches:g}x the global batch"
        if layout.micro_batches < wanted
        else f"at least 4 x {layout.pp} stages"
    )
    versus = f" against {gib(best.inter_node_bytes_per_node)} for {best.label}" if best is not option else ""
    return (
        f"{option.label}: {layout.pp} pipeline stages send only activations between stages"
        f" ({gib(option.inter_node_bytes_per_node)} per node per step between nodes{versus}), but with"
        f" {layout.micro_batches} micro batches per step ({verdict}) the bubble idles (p-1)/(m+p-1) ="
        f" {bubble:.0%} of every step."
    )

"""Will the run fit (issue 40): checked before any launch, so a run that cannot fit never starts.

- The sequence against the model: --max-length (with --pack every sequence is exactly that long) above the
  model's `max_position_embeddings` is refused; where the model's config declares RoPE scaling that covers the
  length it is a warning (the model was made for it, but beyond its trained context quality may drop). Read from
  config.json (or the embedded model's constants) alone: no transformers import, so it is said in a second. Before
  this, a length typo (100000 for 1000) packed the whole dataset into one sequence and a CPU rank grew to 24 GB
  before the OOM killer ended it, silently.
- The planner in the preflight: the run's own shape (model, stage, offload, LoRA, precision, micro batch,
  sequence length, activation checkpointing, ranks per node) through `zero_kit.plan.memory`, the same terms
  `zero-kit plan` prints. On CPU the peak per rank times the ranks on this host against the host's available RAM
  (`ZERO_KIT_HOST_MEM_BYTES` overrides the figure: what-if runs, tests); on a GPU the peak per GPU against that
  GPU's free memory, in the rank (a CUDA query in the launching parent would hold a CUDA context all run long).
  Over the limit: refused with both figures and the cheapest flag set the planner finds that fits
  (`cheapest_fix`); within 10% of it, a warning. `--no-memory-check` goes on regardless.

The planner's figure is also what a rank killed for memory is compared with (`memory_note`, for the supervisor).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from zero_kit.errors import UserError
from zero_kit.log import warn
from zero_kit.metrics import GIB, gib
from zero_kit.train.guards.preflight import HOST_MEM_ENV, host_mem_bytes
from zero_kit.train.options import TrainOptions
from zero_kit.train.plan import model_config_dict

WARN_FRACTION = 0.9
"""A planned peak above this fraction of the limit is said as a warning: the plan is an estimate, not a bound."""
CPU_RANK_BASELINE_GIB = 0.9
"""Host RAM of a CPU rank before its model: Python, torch, transformers, DeepSpeed, the tokenizer and the data
pipeline: what a one-rank run holds beyond the planner's terms, 0.73-0.88 GiB at 512-4096 tokens
(benchmarks/plan_rss). The planner's host_baseline_gib, 2 GiB, is a GPU rank's, with the CUDA libraries loaded."""
ADDRESS_SPACE_OVERHEAD_GIB = 1.6
"""What a CPU rank maps beyond its resident set (shared libraries, thread stacks, malloc arenas): an RLIMIT_AS cap
counts it, the planner's peak (resident bytes) does not. Measured: after importing torch, transformers, DeepSpeed
and datasets, 1.89 GiB mapped against 0.34 GiB resident."""
CPU_SCORE_BYTES = 4
"""Packed rows (`--pack`), bytes per attention score on the CPU: torch's CPU attention for the packing collator's
mask materialises one layer's fp32 scores at a time (micro x heads x s^2 x 4; benchmarks/plan_rss: the measured
peak grows with s^2 at that rate, where a GPU's flash kernels hold none)."""
CPU_MASK_BYTES = 1
"""Rows not packed, bytes per element of the boolean attention mask each sequence gets (s x s; under sequence
parallelism s / sp x s per rank); CPU attention then holds no scores. Measured by benchmarks/long_sequences' cap
study: with this term the guard's longest sequence under a 4 GiB `ulimit -v` is the longest that trained, 23,552
tokens on one rank and 49,152 with --sp 2 --tiled-compute (with the fp32 scores it said 8,448 and 13,312)."""


# --- the sequence against the model ------------------------------------------------------------------------------


def positions(config: dict) -> tuple[int | None, int | None, str]:
    """(max_position_embeddings, the length RoPE scaling covers or None, how that was computed).

    linear/dynamic scaling (no `original_max_position_embeddings`): max_position_embeddings is the trained context
    and the factor stretches it; llama3/yarn/longrope name the original context, and max_position_embeddings is
    usually the stretched one already: the larger of the two counts."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    limit = config.get("max_position_embeddings", text.get("max_position_embeddings"))
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return None, None, ""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 1:
        return limit, None, ""
    kind = rope.get("rope_type") or rope.get("type") or "rope"
    original = rope.get("original_max_position_embeddings")
    if isinstance(original, int) and original > 0:
        return limit, max(limit, int(original * factor)), f"{kind} scaling: {original} x {factor:g}"
    return limit, int(limit * factor), f"{kind} scaling: {limit} x {factor:g}"


def check_length(opts: TrainOptions) -> str | None:
    """Raises UserError when --max-length is past what the model's positions allow; returns a warning line when
    only RoPE scaling covers it; None when it fits (or the config cannot be read: the input checks say why)."""
    config = model_config_dict(opts)
    limit, covered, how = positions(config) if config is not None else (None, None, "")
    length = opts.max_length
    if limit is None or length <= limit:
        return None
    model = opts.model or "the embedded model"
    packed = ", and --pack makes every sequence that long" if opts.pack else ""
    if covered is not None and length <= covered:
        return (f"--max-length {length} is past {model}'s max_position_embeddings {limit}; its RoPE scaling covers"
                f" {covered} ({how}), but quality beyond the trained context may drop")  # fmt: skip
    scaled = f" (its RoPE scaling covers {covered}: {how})" if covered is not None else ""
    raise UserError(
        f"--max-length {length} is longer than {model} can attend over: max_position_embeddings {limit}{scaled}"
        f"{packed}",
        f"pass --max-length {covered or limit} or less (e.g. --max-length {min(covered or limit, 2048)}), or a"
        " --model with a longer context",
    )


# --- the planner's peak per rank ----------------------------------------------------------------------------------


def rank_peak(view, on_gpu: bool) -> int:
    """The planner's peak per rank of `view` (a `zero_kit.train.plan.PlannerView`): on a GPU its total per GPU
    (states, activations, buffers, CUDA context, allocator slack), as `zero-kit plan` prints it; on the CPU the
    same states, activations and buffers in host RAM, without the CUDA context and the caching allocator's slack,
    plus a CPU rank's baseline (CPU_RANK_BASELINE_GIB), one layer's attention scores (CPU_SCORE_BYTES) and any
    offloaded states."""
    from zero_kit.plan.memory import Hardware, evaluate, state_terms

    info = _strategy_info(view.strategy, view.offload)
    hardware = Hardware(
        gpu_mem=GIB, gpus_per_node=view.ranks_per_node, nodes=view.nodes, assume=view.assume, cpu_ranks=not on_gpu
    )
    option = evaluate(info, view.workload, hardware)
    if on_gpu:
        return option.gpu_bytes()["total"]
    gpu_only = ("CUDA context + NCCL", "allocator slack")
    terms = {**option.states, **option.activations, **option.buffers}
    held = sum(value for name, (value, _) in terms.items() if name not in gpu_only)
    _, offloaded, _ = state_terms(view.strategy, view.offload, view.workload, view.ranks_per_node * view.nodes)
    return (
        held
        + sum(value for value, _ in offloaded.values())
        + cpu_scores_bytes(view.workload)
        + int(CPU_RANK_BASELINE_GIB * GIB)
    )


def cpu_scores_bytes(work) -> int:
    """What CPU attention holds for one layer beyond the planner's terms, by the mask it gets: packed rows, the
    layer's fp32 scores (CPU_SCORE_BYTES; under sequence parallelism a rank attends over the whole sequence with
    heads / sp of the heads); rows not packed, each sequence's boolean mask (CPU_MASK_BYTES), for the rank's
    s / sp queries over the whole sequence."""
    if work.packed:
        return work.sequences * work.shape.heads * work.seq_len**2 * CPU_SCORE_BYTES // work.sp
    return work.sequences * work.seq_len**2 * CPU_MASK_BYTES // work.sp


def _strategy_info(strategy: str, offload: str):
    """The registry's flat DeepSpeed entry of a byte-table row, with the run's offload (ZeRO-1 with offload has
    no entry of its own)."""
    from zero_kit.strategies import STRATEGIES

    base = next(i for i in STRATEGIES.values()
                if i.accounting == strategy and i.backend == "deepspeed" and i.hierarchy == "flat")  # fmt: skip
    return dataclasses.replace(base, offload_optimizer=offload != "none", offload_param=offload == "optimizer+param")


@dataclass(frozen=True)
class Shape:
    """What a fix may change: the flags and, beside them, the planner's view they give."""

    flags: tuple[str, ...]
    view: object
    ranks: int


def candidates(view, opts: TrainOptions, on_gpu: bool) -> list[Shape]:
    """Flag sets that lower the peak, cheapest first: a smaller micro batch with more accumulation (the same
    global batch, a little slower), activation checkpointing (about a third more compute), ZeRO-3 (more
    communication), then on a GPU optimizer and parameter offload (host RAM and PCIe), and on the CPU fewer ranks
    on this host (slower, the same result with more accumulation). A --ds-config file decides the stage and
    offload, so only batch and checkpointing changes are offered there."""
    work = view.workload
    micro, accum = work.micro_batch, opts.grad_accum
    smaller = [m for m in range(micro - 1, 0, -1) if micro % m == 0]
    batches = [((), micro)] + [((f"--micro-batch {m}", f"--grad-accum {accum * micro // m}"), m) for m in smaller]
    checkpointing = [False] if work.activation_checkpointing else [False, True]
    layouts = [((), view.strategy, view.offload)]
    if opts.ds_config is None and view.strategy != "zero3" and view.ranks_per_node * view.nodes > 1:
        layouts.append((("--stage 3",), "zero3", view.offload))
    if opts.ds_config is None and on_gpu and view.offload == "none":
        stage = ("--stage 3",) if view.strategy != "zero3" else ()
        layouts.append(((*stage, "--offload-optimizer cpu"), "zero3" if stage else view.strategy, "optimizer"))
        layouts.append(((*stage, "--offload-optimizer cpu", "--offload-param cpu"), "zero3", "optimizer+param"))
    found = []
    for layout_flags, strategy, offload in layouts:
        for ac in checkpointing:
            for batch_flags, m in batches:
                flags = (*layout_flags, *(("--activation-checkpointing",) if ac else ()), *batch_flags)
                if not flags:
                    continue
                shaped = dataclasses.replace(
                    work, micro_batch=m, activation_checkpointing=work.activation_checkpointing or ac
                )
                found.append(Shape(flags, dataclasses.replace(view, workload=shaped, strategy=strategy, offload=offload),
                                   view.ranks_per_node))  # fmt: skip
    found += _long_sequence_candidates(view, checkpointing)
    if not on_gpu and opts.nproc and view.ranks_per_node > 1:
        for ranks in range(view.ranks_per_node - 1, 0, -1):
            if ranks % work.sp == 0:  # whole sequence-parallel groups
                found.append(Shape((f"--nproc {ranks}",), dataclasses.replace(view, ranks_per_node=ranks), ranks))
    return found


def _long_sequence_candidates(view, checkpointing: list[bool]) -> list[Shape]:
    """For what a sequence's length costs: --tiled-compute (one more MLP and head forward), then --sp over more of a
    node's ranks (an all-to-all per attention layer; heads that Ulysses can split), each alone and with tiling,
    each also with activation checkpointing."""
    from zero_kit.lint.rules_ulysses import sp_sizes

    work, shape = view.workload, view.workload.shape
    changes = [] if work.tiled else [(("--tiled-compute",), {"tiled": True})]
    for sp in sp_sizes(shape.heads, shape.kv_heads, work.seq_len, view.ranks_per_node, above=work.sp):
        changes.append(((f"--sp {sp}",), {"sp": sp}))
        if not work.tiled:
            changes.append(((f"--sp {sp}", "--tiled-compute"), {"sp": sp, "tiled": True}))
    found = []
    for flags, change in changes:
        for ac in checkpointing:
            shaped = dataclasses.replace(work, activation_checkpointing=work.activation_checkpointing or ac, **change)
            flags_ac = (*flags, *(("--activation-checkpointing",) if ac else ()))
            found.append(Shape(flags_ac, dataclasses.replace(view, workload=shaped), view.ranks_per_node))
    return found


def cheapest_fix(view, opts: TrainOptions, on_gpu: bool, limit: int, rank_limit: int | None = None
                 ) -> tuple[Shape, int] | None:  # fmt: skip
    """The first candidate whose planned peak (per GPU, or per rank x ranks on this host) is within `limit`, and
    per rank within `rank_limit` where each rank has a cap of its own (RLIMIT_AS: fewer ranks do not lift it)."""
    for shape in candidates(view, opts, on_gpu):
        peak = rank_peak(shape.view, on_gpu)
        need = peak * (1 if on_gpu else shape.ranks)
        if need <= limit and (rank_limit is None or peak <= rank_limit):
            return shape, need
    return None


# --- the checks ---------------------------------------------------------------------------------------------------


def _address_space_cap() -> int | None:
    """This process's address space cap (RLIMIT_AS, `ulimit -v`), which each rank inherits; None without one."""
    import resource

    cap = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if cap == resource.RLIM_INFINITY else cap


def rank_cap_bytes(cap: int | None = None) -> int | None:
    """What a CPU rank may hold under an address space cap (`cap` bytes; default this process's, None without one):
    the cap less what a rank maps beyond what it holds."""
    cap = _address_space_cap() if cap is None else cap
    return None if cap is None else max(cap - int(ADDRESS_SPACE_OVERHEAD_GIB * GIB), 0)


def available_host_bytes(ranks: int) -> tuple[int, str]:
    """What `ranks` CPU ranks on this host can have now, and what that figure is: psutil's available RAM (what a
    new process gets without swapping), or ZERO_KIT_HOST_MEM_BYTES; and where this process runs under an address
    space cap (RLIMIT_AS, `ulimit -v`), which each rank inherits, at most that cap per rank (`rank_cap_bytes`)."""
    if os.environ.get(HOST_MEM_ENV):
        have, where = host_mem_bytes(), f"host RAM ({HOST_MEM_ENV})"
    else:
        import psutil

        have, where = psutil.virtual_memory().available, "available host RAM"
    cap = _address_space_cap()
    usable = None if cap is None else rank_cap_bytes(cap)
    if usable is not None and usable * ranks < have:
        have = usable * ranks
        where = (f"RLIMIT_AS (ulimit -v) {gib(cap, 2)} per rank, less {ADDRESS_SPACE_OVERHEAD_GIB:g} GiB a rank maps"
                 f" beyond what it holds, x {ranks}")  # fmt: skip
    return have, where


def judge(view, opts: TrainOptions, on_gpu: bool, available: int, where: str) -> str | None:
    """Raises UserError when the planned peak is over `available` (naming both and the cheapest fix); returns
    a warning line within 10% of it, else None. `where`: what `available` is, for the message."""
    ranks = 1 if on_gpu else view.ranks_per_node
    per_rank = rank_peak(view, on_gpu)
    need = per_rank * ranks
    unit = "per GPU" if on_gpu else f"per rank x {ranks} rank(s) on this host"
    said = f"planned peak {gib(per_rank, 2)} {unit} = {gib(need, 2)} vs {gib(available, 2)} {where}"
    if need > available:
        cap = None if on_gpu else rank_cap_bytes()
        fix = cheapest_fix(view, opts, on_gpu, int(available * WARN_FRACTION), cap and int(cap * WARN_FRACTION))
        fix = fix or cheapest_fix(view, opts, on_gpu, available, cap)
        shape = (
            f"--max-length {opts.max_length}, --micro-batch {view.workload.micro_batch}, {view.strategy}, offload "
            f"{view.offload}, activation checkpointing {'on' if view.workload.activation_checkpointing else 'off'}"
        )
        advice = (
            f"add {' '.join(fix[0].flags)} (planned {gib(fix[1], 2)}); or --no-memory-check to run anyway"
            if fix
            else "no flag set the planner tried fits: use a shorter --max-length, a larger machine, or"
            " --no-memory-check to run anyway"
        )
        raise UserError(f"the run does not fit in memory ({shape}): {said}", advice)
    if need > available * WARN_FRACTION:
        return f"warning: the run may not fit in memory: {said} (within {1 - WARN_FRACTION:.0%})"
    return None


def cpu_view(plan):
    """The planner's view of a CPU run with the ranks on this host, or None when not a CPU run, a hostfile run
    (other hosts' RAM is not ours to read), or --no-memory-check."""
    opts = plan.options
    if not opts.memory_check or opts.hostfile or plan.on_gpu:  # GPU ranks check their own memory
        return None
    return plan.planner()


def check_gpu_memory(plan, view, device: str) -> str | None:
    """The GPU check of one rank (`view`: its plan's planner view), before the model is built: its GPU's free
    memory."""
    if not plan.options.memory_check or not plan.on_gpu:
        return None
    import torch

    free, _ = torch.cuda.mem_get_info()
    return judge(view, plan.options, True, free, f"free on {device}")


def say(line: str | None) -> None:
    if line:
        warn(f"zero-kit train: {line}")


def plan_and_fix(view, opts: TrainOptions, on_gpu: bool) -> tuple[int, str]:
    """The planned peak per rank, and the cheapest flags that lower the plan by a quarter: what a report of an
    out-of-memory that happened anyway adds (the plan fitted, so the machine had less than it said, or the plan
    was low)."""
    per_rank = rank_peak(view, on_gpu)
    ranks = 1 if on_gpu else view.ranks_per_node
    capped = not on_gpu and rank_cap_bytes() is not None  # each rank ran out of its own cap: fewer do not help
    fix = cheapest_fix(view, opts, on_gpu, int(per_rank * ranks * 0.75), int(per_rank * 0.75) if capped else None)
    return per_rank, " ".join(fix[0].flags) if fix else "a shorter --max-length"


def memory_note(view, opts: TrainOptions, on_gpu: bool) -> str:
    """`plan_and_fix` as the supervisor says it beside a rank killed by SIGKILL."""
    per_rank, flags = plan_and_fix(view, opts, on_gpu)
    return f"planned peak {gib(per_rank, 2)} per rank; fix: {flags}"


def before_launch(plan, speak: bool) -> str | None:
    """The checks of a run (`plan`: its RunPlan) before any rank starts, in the process that starts them: RoPE
    scaling's warning and the host memory check (refusal or warning). Returns the memory note for a rank the kernel
    kills later, or None when the memory is not this process's to check."""
    opts = plan.options
    warning = check_length(opts)
    if speak:
        say(warning)
    view = cpu_view(plan)
    if view is None:
        return None
    line = judge(view, opts, False, *available_host_bytes(view.ranks_per_node))
    if speak:
        say(line)
    return memory_note(view, opts, False)

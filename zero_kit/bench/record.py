"""One rank's JSON record of a `zero-kit bench` run: what was measured (losses, step times and their phases, bytes
held by every rank, peak memory, collective bytes, MFU on GPU) and under what (model, batch, versions, hardware).
Rank 0 writes it; zero_kit.bench.report adds the predictions and comparisons."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
from typing import Any

from zero_kit.bench.options import BenchOptions
from zero_kit.bench.phases import PHASES
from zero_kit.dist import THP_ENV, THREADS_ENV, local_size_from_env
from zero_kit.metrics import COMM_PHASES, CommCounter


def _compiled_graphs() -> int:
    """Graphs TorchDynamo captured in this process (0 means torch.compile fell back to eager everywhere)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _compile_threads() -> int | None:
    """Inductor's compile threads in this process (1: compiled in the rank itself; None: not decided, nothing was
    compiled by Inductor)."""
    import torch._inductor.config

    return torch._inductor.config.compile_threads


def _environment(device: str) -> dict[str, Any]:
    import importlib.metadata as metadata

    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("transformers", "deepspeed"):  # metadata, not import: DDP/FSDP runs stay free of deepspeed
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    hardware = {"machine": platform.machine(), "cpu": _cpu_model(), "cpus": os.cpu_count()}
    if device.startswith("cuda"):
        hardware["gpu"] = torch.cuda.get_device_name()
    # what the rank started with that moves its speed: threads, huge pages (zero_kit.dist), glibc's malloc
    rank_env = {name: os.environ.get(name) for name in (THREADS_ENV, THP_ENV, "GLIBC_TUNABLES")}
    return {"versions": versions, "hardware": hardware, "rank_env": rank_env}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def build_record(
    strategy, opts: BenchOptions, result: dict, model, device: str, counter: CommCounter, info=None
) -> dict[str, Any]:
    """Rank 0's record (every rank joins its gathers); `info`: the run's registry entry (default: the strategy's
    name in STRATEGIES; a user's own config passes its own)."""
    import torch.distributed as dist

    from zero_kit.metrics import flops_per_token, mfu, peak_flops, peak_memory
    from zero_kit.plan.accounting import StateBytes

    world = dist.get_world_size()
    mine = StateBytes(result["bytes"][0], result["bytes"][1], result["bytes"][2]).as_dict()
    per_rank: list[Any] = [None] * world
    steps = opts.steps - opts.warmup
    tiers = counter.summary(steps)["ring_bytes_sent_by_tier"]
    held = strategy.params_held()
    timed = result["phases"][opts.warmup :]
    middle = middle_half(result["step_times_s"][opts.warmup :])
    phases = phase_means([timed[i]["phases"] for i in middle])
    dist.all_gather_object(per_rank, {"state": mine, "mem": peak_memory(device.split(":")[0]), "tiers": tiers,
                                      "held": held, "phases": phases})  # fmt: skip
    cfg = model.config
    info = info or _registry(strategy.name)
    tokens = opts.micro_batch * opts.grad_accum * opts.seq_len  # under --sp too (_batch_entry)
    per_rank_tps = tokens / result["median"]
    fpt = flops_per_token(strategy.n_params, cfg.num_hidden_layers, cfg.hidden_size, opts.seq_len)
    gpu = device.startswith("cuda")
    return {
        "strategy": strategy.name,
        "world_size": world,
        "nnodes": world // _ranks_per_node(counter, world),
        "ranks_per_node": _ranks_per_node(counter, world),
        "precision": opts.precision,
        "device": device.split(":")[0],
        "model": {
            **_model_entry(strategy, model.config, opts.seq_len),
            "params_held_by_rank": [r["held"] for r in per_rank],
        },
        "parallel": _parallel_entry(info, world),
        "batch": _batch_entry(opts, info.sequence_parallel, world),
        "steps": opts.steps,
        "warmup": opts.warmup,
        "losses": result["losses"],
        "grad_norms": result["grad_norms"],  # before clipping, as the backend computed them (None: it keeps none)
        "step_times_s": result["step_times_s"],
        "step_time_s": result["median"],
        **_phase_entry(phases, timed, middle, result["ds_timers"][opts.warmup :], per_rank),
        "tokens_per_s": {"per_rank": per_rank_tps, "total": per_rank_tps * world},
        "model_state_bytes_per_rank": {**mine, "all_ranks": [r["state"] for r in per_rank], "how": strategy.notes()},
        "peak_mem_bytes": {k: max(r["mem"][k] for r in per_rank) for k in per_rank[0]["mem"]},
        "comm_bytes_per_step": _comm_entry(counter, steps, per_rank, world),
        "deepspeed_comms_logger_per_step": result["ds_comms_log"],  # --ds-comms-log: DeepSpeed's own view
        "compiled_graphs": _compiled_graphs() if opts.compile else None,  # proof that torch.compile really ran
        "compile_threads": _compile_threads() if opts.compile else None,  # Inductor's: 1 = in the rank (worker.py)
        "flops_per_token": fpt,
        "mfu": mfu(per_rank_tps, fpt, peak_flops(torch_device_name(device), opts.precision)) if gpu else None,
        "options": dataclasses.asdict(opts),
        **_pipeline_entry(result["extra"], opts.warmup),
        **_environment(device),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def middle_half(step_seconds: list[float]) -> list[int]:
    """Indices of the steps whose times lie in the middle half (between the quartiles, by rank): the steps the
    record's phases are averaged over."""
    order = sorted(range(len(step_seconds)), key=lambda i: step_seconds[i])
    cut = len(order) // 4
    return sorted(order[cut : len(order) - cut])


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def phase_means(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per phase (phases.PHASES), the mean over `steps` in ms; None where a phase is not apart (a pipeline's
    backward, inside its one schedule phase). Means of the middle half, not medians: means add up, so the phases
    sum to those steps' mean time, within a few percent of the median step; medians of each phase do not (a slow
    step is slow in one phase, which each phase's median leaves out but the step's median does not: 89-92% of the
    median step on a loaded 2-core machine)."""
    return {phase: _ms(_mean([s[phase] for s in steps if s.get(phase) is not None])) for phase in PHASES}


def _phase_entry(phases: dict, timed: list[dict], middle: list[int], ds_timers: list[dict],
                 per_rank: list[dict]) -> dict[str, Any]:  # fmt: skip
    """The step's phases (bench.phases.PhaseClock) over the middle half of the timed steps (phase_means), on rank 0
    and on every rank; each timed step's split on rank 0 (it adds up to that step's time); where the collective
    seconds fell (each window's wall time and the collective seconds inside it) and DeepSpeed's own timers (ZeRO
    runs), averaged over the same steps."""
    windows = {
        name: {part: _ms(_mean([timed[i]["windows"][name][part] for i in middle])) for part in ("wall", *COMM_PHASES)}
        for name in (timed[0]["windows"] if timed else ())
    }
    names = sorted({name for step in ds_timers for name in step})
    return {
        "phases_ms": phases,
        "phases_ms_by_rank": [r["phases"] for r in per_rank],
        "phases_by_step_ms": [{k: _ms(v) for k, v in t["phases"].items()} for t in timed],
        "phases_timed_steps": middle,  # which of phases_by_step_ms the means are of
        "phase_windows_ms": windows,
        "ds_timers_ms": (
            {name: _mean([ds_timers[i].get(name, 0.0) for i in middle]) for name in names} if names else None
        ),
    }


def _registry(name: str):
    from zero_kit.strategies import strategy_info

    return strategy_info(name)


def _batch_entry(opts: BenchOptions, sp: int, world: int) -> dict[str, int]:
    """Rows per micro step, micro steps per step, ranks per row and rows per step. A `_spN` rank runs sp x the
    micro steps, each on 1/sp of every row: the tokens of an sp=1 rank, and the same global batch."""
    return {"micro": opts.micro_batch, "grad_accum": opts.grad_accum * sp, "sequence_parallel": sp,
            "global": opts.micro_batch * opts.grad_accum * world}  # fmt: skip


def _parallel_entry(info, world: int) -> dict[str, int]:
    """The run's degrees: tensor x pipeline ranks per model replica, sequence-parallel ranks per row, the rest data
    parallel (the registry's)."""
    data = world // info.model_parallel // info.sequence_parallel
    return {"tensor": info.tensor_parallel, "pipeline": info.pipeline_stages, "sequence": info.sequence_parallel,
            "data": data}  # fmt: skip


def _pipeline_entry(extra: dict[str, Any], warmup: int) -> dict[str, Any]:
    """A pipeline's bubble per rank: 1 - compute seconds / the schedule's wall seconds over the timed steps."""
    if "pipeline" not in extra:
        return extra
    pipeline = dict(extra["pipeline"])
    idle = []
    for rank in pipeline["by_rank"]:
        busy, wall = sum(rank["busy_s"][warmup:]), sum(rank["wall_s"][warmup:])
        idle.append(1 - busy / wall if wall else None)
    return {**extra, "pipeline": {**pipeline, "bubble_by_rank": idle}}


def _model_entry(strategy, cfg, seq_len: int) -> dict[str, Any]:
    """The model's shape as the record (and the planner's calibration) reads it back."""
    return {
        "n_params": strategy.n_params,  # counted before wrapping: ZeRO-3 empties the module parameters
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads,
        "intermediate": cfg.intermediate_size,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "vocab": cfg.vocab_size,
        "seq_len": seq_len,
        "param_numels": strategy.param_numels,  # the exact ZeRO-1/2 gradient partitions depend on them
    }


def _comm_entry(counter: CommCounter, steps: int, per_rank: list[dict], world: int) -> dict[str, Any]:
    return {
        **counter.summary(steps),
        # All ranks together, per link tier (the ring model in zero_kit.metrics): what crosses the slow link.
        "ring_bytes_sent_all_ranks_by_tier": {
            tier: sum(r["tiers"][tier] for r in per_rank) for tier in ("intra_node", "inter_node")
        },
        "ranks_per_node": _ranks_per_node(counter, world),
    }


def _ranks_per_node(counter: CommCounter, world: int) -> int:
    """The node of this run: the counter's (--gpus-per-node, else the launcher's ranks per node)."""
    return min(counter.ranks_per_node or local_size_from_env(dict(os.environ)) or world, world)


def torch_device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else ""

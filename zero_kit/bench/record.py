"""One rank's JSON record of a `zero-kit bench` run: what was measured (losses, step times, bytes held by every
rank, peak memory, collective bytes, MFU on GPU) and under what (model, batch, versions, hardware). Rank 0 writes
it; zero_kit.bench.report adds the predictions and comparisons."""

from __future__ import annotations

import dataclasses
import os
import platform
from typing import Any

from zero_kit.bench.options import BenchOptions
from zero_kit.dist import local_world_size
from zero_kit.metrics import CommCounter


def _compiled_graphs() -> int:
    """Graphs TorchDynamo captured in this process (0 means torch.compile fell back to eager everywhere)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


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
    return {"versions": versions, "hardware": hardware}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def build_record(
    strategy, opts: BenchOptions, result: dict, model, device: str, counter: CommCounter
) -> dict[str, Any]:
    import torch.distributed as dist

    from zero_kit.metrics import flops_per_token, mfu, peak_flops, peak_memory
    from zero_kit.plan.accounting import StateBytes

    world = dist.get_world_size()
    mine = StateBytes(result["bytes"][0], result["bytes"][1], result["bytes"][2]).as_dict()
    per_rank: list[Any] = [None] * world
    steps = opts.steps - opts.warmup
    tiers = counter.summary(steps)["ring_bytes_sent_by_tier"]
    held = strategy.params_held()
    dist.all_gather_object(per_rank, {"state": mine, "mem": peak_memory(device.split(":")[0]), "tiers": tiers,
                                      "held": held})  # fmt: skip
    cfg = model.config
    tokens = opts.micro_batch * opts.grad_accum * opts.seq_len
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
        "parallel": _parallel_entry(strategy.name, world),
        "batch": {"micro": opts.micro_batch, "grad_accum": opts.grad_accum, "global": tokens // opts.seq_len * world},
        "steps": opts.steps,
        "warmup": opts.warmup,
        "losses": result["losses"],
        "step_times_s": result["step_times_s"],
        "step_time_s": result["median"],
        "tokens_per_s": {"per_rank": per_rank_tps, "total": per_rank_tps * world},
        "model_state_bytes_per_rank": {**mine, "all_ranks": [r["state"] for r in per_rank], "how": strategy.notes()},
        "peak_mem_bytes": {k: max(r["mem"][k] for r in per_rank) for k in per_rank[0]["mem"]},
        "comm_bytes_per_step": _comm_entry(counter, steps, per_rank, world),
        "deepspeed_comms_logger_per_step": result["ds_comms_log"],  # --ds-comms-log: DeepSpeed's own view
        "compiled_graphs": _compiled_graphs() if opts.compile else None,  # proof that torch.compile really ran
        "flops_per_token": fpt,
        "mfu": mfu(per_rank_tps, fpt, peak_flops(torch_device_name(device), opts.precision)) if gpu else None,
        "options": dataclasses.asdict(opts),
        **_pipeline_entry(result["extra"], opts.warmup),
        **_environment(device),
    }


def _parallel_entry(name: str, world: int) -> dict[str, int]:
    """The run's degrees: tensor x pipeline ranks per model replica, the rest data parallel (the registry's)."""
    from zero_kit.strategies import STRATEGIES

    info = STRATEGIES[name]
    return {"tensor": info.tensor_parallel, "pipeline": info.pipeline_stages, "data": world // info.model_parallel}


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
    return min(counter.ranks_per_node or local_world_size(world), world)


def torch_device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else ""

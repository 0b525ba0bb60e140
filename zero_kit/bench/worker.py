"""One rank of one strategy run (`python -m zero_kit.bench --strategy S --options-json J`, started by `torchrun`
for ddp/fsdp or the `deepspeed` launcher for zeroN). Same seeded LLaMA-style model, same synthetic data (rank r
takes rows r, r+N, ... of each fixed global batch), same AdamW, so fp32 losses agree across strategies. Rank 0
appends one JSON record to `--record`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from zero_kit.bench.options import PROGRESS, BenchOptions
from zero_kit.dist import set_rank_huge_pages, set_rank_threads
from zero_kit.log import say
from zero_kit.metrics import CommCounter
from zero_kit.plan.shapes import local_model_params
from zero_kit.strategies import is_user_config, strategy_info
from zero_kit.watchdog import Heartbeat


def synthetic_rows(step: int, rows: int, seq_len: int, vocab: int, seed: int):
    """Global batch of `rows` arithmetic token sequences (learnable, so the loss falls): a fixed function of
    (seed, step), independent of strategy and world size."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (rows, 1), generator=g)
    stride = torch.randint(1, 17, (rows, 1), generator=g)
    return (start + stride * torch.arange(seq_len)) % vocab


def rank_micro_batches(
    step: int, opts: BenchOptions, split: tuple[int, int, int], world: int, vocab: int
) -> list[dict[str, Any]]:
    """This rank's rows of the step's global batch (micro x accum x world rows, whatever the strategy), in the
    pieces `split` (Strategy.data_split: data-parallel rank, data-parallel ranks, calls) asks for."""
    rows = opts.micro_batch * opts.grad_accum * world
    data_rank, data_world, calls = split
    mine = synthetic_rows(step, rows, opts.seq_len, vocab, opts.seed)[data_rank::data_world]  # DistributedSampler
    chunks = mine.split(len(mine) // calls)
    return [{"input_ids": c, "labels": c} for c in chunks]


def model_config(opts: BenchOptions):
    """The LLaMA config of the run; a bad size override is the user's mistake, reported before any launch."""
    from transformers import AutoConfig

    from zero_kit.errors import UserError
    from zero_kit.model import tiny_llama_config

    overrides = {k: v for k, v in (("hidden_size", opts.hidden_size), ("num_hidden_layers", opts.layers)) if v}
    try:
        if opts.model == "tiny":
            config = tiny_llama_config(opts.vocab_size, **overrides)
        else:
            # Explicitly False: transformers never runs code of the directory (auto_map) nor asks on stdin.
            config = AutoConfig.from_pretrained(opts.model, trust_remote_code=False, **overrides)
    except (ValueError, OSError) as err:
        raise UserError(f"cannot build the model config (--model {opts.model}): {err}",
                        "pick --hidden-size as a multiple of the head count, or a valid model DIR") from err  # fmt: skip
    config._attn_implementation = "sdpa"
    return config


def build_model(opts: BenchOptions):
    """Seeded LLaMA-architecture model, identical on every rank; SDPA attention."""
    import torch
    from transformers import LlamaForCausalLM

    config = model_config(opts)
    torch.manual_seed(opts.seed)
    return LlamaForCausalLM(config)


def _init_distributed(backend_kind: str, pg_backend: str) -> None:
    import torch.distributed as dist

    if backend_kind == "deepspeed":
        from zero_kit.launch.ops import init_distributed

        init_distributed(pg_backend)  # op loads guarded (no dead lock waited on); no shared memory left behind
    elif not dist.is_initialized():
        dist.init_process_group(pg_backend)


def _global_mean(value: float | None, device: str) -> float:
    """Mean over the ranks that hold a loss (a pipeline's first stage holds none)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value or 0.0, float(value is not None)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


def _scalar(loss) -> float:
    """A micro batch's loss as a float: a tensor is read detached (float() on one that requires grad warns at every
    step), a float as it is; the same number either way."""
    return loss.detach().item() if hasattr(loss, "detach") else float(loss)


def _run_step(strategy, micro: list[dict[str, Any]], phases, label, before_step=None) -> list:
    """One optimizer step, its windows marked on `phases` (bench.phases.PhaseClock); `label(name)` is a context around
    each window (the profiler's ranges when profiling); `before_step` runs between the last backward and the step.
    Returns the micro batches' losses, as tensors or floats."""
    held = []
    for i, batch in enumerate(micro):
        last = i == len(micro) - 1
        if strategy.phases_apart:
            with label("forward"):
                loss = strategy.forward(batch, last)
            phases.mark("forward")
            with label("backward"):
                strategy.backward(loss, last)
            phases.mark("backward")
        else:
            with label("forward_backward"):
                loss = strategy.forward_backward(batch, last)
            phases.mark("forward_backward")
        held.append(loss)
    if before_step is not None:
        before_step()
    with label("step"):
        strategy.step()
    phases.mark("step")
    return held


def profile_step(opts: BenchOptions) -> int | None:
    """The step `--profile` traces: the last warm-up step (the same code as a timed step, left out of the timing so
    the profiler's cost does not enter the medians); step 0 without warm-up."""
    return max(opts.warmup - 1, 0) if opts.profile else None


def profile_path(opts: BenchOptions, strategy: str) -> Path:
    """Where rank 0 writes the chrome trace of `strategy` (chrome://tracing, https://ui.perfetto.dev)."""
    return Path(opts.out) / "profile" / f"{strategy}.json"


@contextlib.contextmanager
def _traced(opts: BenchOptions, strategy: str, device: str, tracing: bool):
    """Yields the label context of a step's windows: a named range (`zero_kit.forward`, ...) in a torch.profiler
    trace written on leaving when `tracing` (rank 0, --profile), else nothing."""
    if not tracing:
        yield lambda name: contextlib.nullcontext()
        return
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as profiler:
        yield lambda name: record_function(f"zero_kit.{name}")
    path = profile_path(opts, strategy)
    path.parent.mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(str(path))


def _train(strategy, opts: BenchOptions, counter: CommCounter, vocab: int, device: str, heartbeat) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from zero_kit.bench.phases import PhaseClock
    from zero_kit.metrics import DeepSpeedCommsLog, StepTimer

    world, rank = dist.get_world_size(), dist.get_rank()
    split = strategy.data_split()
    sync = torch.cuda.synchronize if device.startswith("cuda") else None
    timer, phases = StepTimer(sync), PhaseClock(counter, sync)
    losses, grads, split_steps, ds_timers, norms = [], [0], [], [], []
    on_deepspeed = strategy.name.startswith("zero") or is_user_config(strategy.name)
    ds_log = DeepSpeedCommsLog() if opts.ds_comms_log and on_deepspeed else None

    def counting(active: bool) -> None:
        counter.active = active
        if ds_log:
            ds_log.set_active(active)

    def read_grads() -> None:
        active = counter.active
        counting(False)  # reading bytes is not part of the step
        grads[0] = strategy.grad_bytes()
        counting(active)

    for step in range(opts.steps):
        micro = [{k: v.to(device) for k, v in b.items()} for b in rank_micro_batches(step, opts, split, world, vocab)]
        with _traced(opts, strategy.name, device, step == profile_step(opts) and rank == 0) as label:
            counting(step >= opts.warmup)
            timer.start()
            phases.begin()
            held = _run_step(strategy, micro, phases, label, read_grads if step == opts.steps - 1 else None)
            elapsed = timer.stop()
            split_steps.append(phases.end(elapsed))
            counting(False)
        ds_timers.append(strategy.step_timers())
        norms.append(strategy.grad_norm())
        held = [_scalar(loss) for loss in held if loss is not None]
        losses.append(_global_mean(sum(held) / len(held) if held else None, device))
        if heartbeat is not None:
            heartbeat.beat("train", step + 1)
        if rank == 0:
            say(f"{PROGRESS} {strategy.name} step {step + 1}/{opts.steps} loss {losses[-1]:.6f} {elapsed:.3f}s")  # fmt: skip
    params, optimizer = strategy.param_and_optimizer_bytes()
    return {
        "losses": losses,
        "step_times_s": timer.times,
        "median": timer.median(opts.warmup),
        "phases": split_steps,
        "ds_timers": ds_timers,
        "grad_norms": norms,
        "bytes": (params, grads[0], optimizer),
        "ds_comms_log": ds_log.summary(opts.steps - opts.warmup, world) if ds_log else None,
        "extra": strategy.extra_record(),
    }


def _build(strategy_name: str, info, user, opts: BenchOptions, device: str, counter: CommCounter):
    """The seeded model wrapped for the strategy, and the record's "ds_config" of a user's own config (`user`, else
    None): the config this rank runs, made at its own device (strategies.deepspeed.user_ds_config)."""
    import torch.distributed as dist

    from zero_kit.bench.options import parse_zero_override
    from zero_kit.lint.installed import ulysses_gradient_scale
    from zero_kit.strategies import StrategyOptions, build_strategy

    model = build_model(opts)
    numels = [p.numel() for p in model.parameters() if p.requires_grad]  # the order DeepSpeed flattens
    n_params = sum(p.numel() for p in model.parameters())
    sp = info.sequence_parallel  # a group of sp ranks takes sp x the micro steps: the global batch of sp=1
    options = StrategyOptions(
        precision=opts.precision,
        micro_batch=opts.micro_batch,
        grad_accum=opts.grad_accum * sp,
        sequence_parallel=sp,
        sp_gradient_scale=ulysses_gradient_scale(info.stage, sp),
        world_size=dist.get_world_size(),
        device=device,
        lr=opts.lr,
        gradient_clipping=opts.gradient_clipping,
        compile=opts.compile,
        ranks_per_node=counter.ranks_per_node,
        zero_overrides=tuple(parse_zero_override(opts.zero_override).items()),
    )
    ds_config, entry = None, None
    if user is not None:
        from zero_kit.strategies.deepspeed import user_ds_config

        ds_config, changes = user_ds_config(user.config, options)
        entry = user.entry(ds_config, changes, opts)
    strategy = build_strategy(strategy_name, model, options, info, ds_config)
    strategy.n_params, strategy.param_numels = n_params, numels
    return model, strategy, entry


def run_rank(strategy_name: str, opts: BenchOptions, record_path: str | None, counter: CommCounter) -> dict:
    """One rank of one strategy run. The counter must be installed before this (and before DeepSpeed)."""
    import torch
    import torch.distributed as dist

    from zero_kit.bench.record import build_record
    from zero_kit.bench.user_config import read_launch_copy
    from zero_kit.dist import device_and_backend, end_process_group
    from zero_kit.strategies import check_name

    torch.use_deterministic_algorithms(True, warn_only=True)
    device, pg_backend = device_and_backend()
    if device.startswith("cuda") and opts.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 on GPU means TF32 matmuls (metrics.PEAK_FLOPS)
    if opts.compile and not device.startswith("cuda") and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        # Inductor compiles in this process, not in a pool of min(32, cores) workers per rank. WHY: on CPU ranks the
        # pool only competes with the ranks for the same cores, and after a cold compile its shutdown at exit can
        # wait up to 300 s (pytorch/pytorch#162199; torch's own distributed inductor tests set 1 for hangs at
        # exit), the likely cause of a 2-rank DDP run that outlived its launch timeout. Read lazily: set before the
        # first compile.
        import torch._inductor.config

        torch._inductor.config.compile_threads = 1
    user = read_launch_copy(opts, strategy_name) if is_user_config(strategy_name) else None  # checked by the driver
    info = user.info if user else check_name(strategy_name)
    _init_distributed("deepspeed" if info.launcher == "deepspeed" else "torch", pg_backend)
    heartbeat = None
    if opts.stall_timeout > 0:  # the launch's own folder: shared by every node, like the results
        beats = Path(opts.out) / "logs" / f"{strategy_name}.launch" / "heartbeat"
        heartbeat = Heartbeat(beats, dist.get_rank(), dist.get_world_size(), opts.stall_timeout).start()
    finished = False
    try:
        model, strategy, user_entry = _build(strategy_name, info, user, opts, device, counter)
        result = _train(strategy, opts, counter, model.config.vocab_size, device, heartbeat)
        record = build_record(strategy, opts, result, model, device, counter, info)
        if user_entry is not None:
            record["ds_config"] = user_entry
        if dist.get_rank() == 0 and record_path:
            with open(record_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        finished = True
        return record
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        end_process_group(finished)


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of a zero-kit bench run (started by a launcher)")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--options-json", default="{}")
    parser.add_argument("--record", default=None, help="JSONL file rank 0 appends its record to")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    args = parser.parse_args(argv)
    set_rank_threads()  # before torch's import: cores / local ranks, unless the user set OMP_NUM_THREADS
    opts = BenchOptions(**json.loads(args.options_json))
    info = strategy_info(args.strategy)  # None for a user's --ds-config run
    set_rank_huge_pages(info and info.stage, local_model_params(opts.model), opts.precision)  # ZeRO-1/2, large
    # The node of the link tiers and of the node-aware strategies: --gpus-per-node where given (on one host it
    # makes simulated nodes, see placement.py), else the launcher's ranks per node.
    counter = CommCounter(ranks_per_node=opts.gpus_per_node or 0).install()
    run_rank(args.strategy, opts, args.record, counter)
    return 0

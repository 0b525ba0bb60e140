"""The comparison runner. Two halves:

- `run_rank(...)`: one rank of one strategy (`python -m zero_kit.bench --strategy S --options-json J`, started by
  `torchrun` for ddp/fsdp or the `deepspeed` launcher for zeroN). Same seeded LLaMA-style model, same synthetic
  data (rank r takes rows r, r+N, ... of each fixed global batch), same AdamW, so fp32 losses agree across
  strategies. Rank 0 appends one JSON record to `--record`.
- `run_bench(options)`: the driver behind `zero-kit bench`: a real launch per strategy, progress display,
  then JSONL + markdown table + PNG plots (zero_kit.bench_report).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

from zero_kit.metrics import CommCounter

PROGRESS = "[zk-bench]"


@dataclass(frozen=True)
class BenchOptions:
    strategies: str = "ddp,fsdp,zero1,zero2,zero3"
    """Comma-separated strategies: ddp, fsdp, zero0..zero3, zero2_offload, zero3_offload, and the DeepSpeed variants
    zero1_reduce / zero2_reduce (per-owner reduce) and zero3_release (re-gather in backward)."""
    nproc: int = 2
    """Ranks (processes) per run; on CPU each is one process using gloo."""
    model: str = "tiny"
    """tiny (the embedded LLaMA-architecture default) or a local HF model DIR (its config, random init)."""
    hidden_size: int | None = None
    """Override the tiny model's hidden size (benchmark size knob)."""
    layers: int | None = None
    """Override the tiny model's number of layers."""
    vocab_size: int = 2048
    """Vocabulary size of the tiny model (synthetic tokens are drawn below it)."""
    seq_len: int = 128
    """Tokens per row."""
    micro_batch: int = 2
    """Rows per rank per micro step."""
    grad_accum: int = 1
    """Micro steps per optimizer step (no_sync / set_requires_gradient_sync / DeepSpeed boundary)."""
    steps: int = 20
    """Optimizer steps per run (losses recorded for every one)."""
    warmup: int = 3
    """Steps excluded from timing and byte counting."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """fp32 for exact parity on CPU; bf16 on GPUs (DeepSpeed bf16 / FSDP2 MixedPrecisionPolicy / DDP autocast)."""
    lr: float = 1e-3
    """AdamW learning rate; high because the tiny model trains from scratch (the loss curve must move)."""
    grad_clip: float = 1.0
    """Clip gradients to this global norm in every strategy (0 disables)."""
    seed: int = 0
    """Seed of the initial weights and of the synthetic data; identical for every strategy."""
    compile: bool = False
    """torch.compile the model in every strategy."""
    ds_comms_log: bool = False
    """Also record DeepSpeed's own comms logger in ZeRO runs (a cross-check of the byte counter; it synchronizes
    after every collective, so leave it off for GPU timings)."""
    out: str = "bench_out"
    """Output directory: results.jsonl, table.md, PNG plots, logs/."""
    master_port: int = 29700
    """First rendezvous port; strategy i uses master_port + i."""
    timeout: int = 600
    """Seconds allowed per strategy run before it is killed and reported failed."""


def synthetic_rows(step: int, rows: int, seq_len: int, vocab: int, seed: int):
    """Global batch of `rows` arithmetic token sequences (learnable, so the loss falls): a fixed function of
    (seed, step), independent of strategy and world size."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (rows, 1), generator=g)
    stride = torch.randint(1, 17, (rows, 1), generator=g)
    return (start + stride * torch.arange(seq_len)) % vocab


def rank_micro_batches(step: int, opts: BenchOptions, rank: int, world: int, vocab: int) -> list[dict[str, Any]]:
    rows = opts.micro_batch * opts.grad_accum * world
    mine = synthetic_rows(step, rows, opts.seq_len, vocab, opts.seed)[rank::world]  # DistributedSampler split
    chunks = mine.split(opts.micro_batch)
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
            config = AutoConfig.from_pretrained(opts.model, **overrides)
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


def _device_and_backend() -> tuple[str, str]:
    import torch

    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return f"cuda:{local}", "nccl"
    return "cpu", "gloo"


def _init_distributed(backend_kind: str, pg_backend: str) -> None:
    import torch.distributed as dist

    if backend_kind == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend=pg_backend)
    elif not dist.is_initialized():
        dist.init_process_group(pg_backend)


def _global_mean(value: float, device: str) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _train(strategy, opts: BenchOptions, counter: CommCounter, vocab: int, device: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from zero_kit.metrics import DeepSpeedCommsLog, StepTimer

    rank, world = dist.get_rank(), dist.get_world_size()
    timer = StepTimer(torch.cuda.synchronize if device.startswith("cuda") else None)
    losses, grads = [], 0
    ds_log = DeepSpeedCommsLog() if opts.ds_comms_log and strategy.name.startswith("zero") else None

    def counting(active: bool) -> None:
        counter.active = active
        if ds_log:
            ds_log.set_active(active)

    for step in range(opts.steps):
        micro = [{k: v.to(device) for k, v in b.items()} for b in rank_micro_batches(step, opts, rank, world, vocab)]
        counting(step >= opts.warmup)
        timer.start()
        step_loss = sum(strategy.forward_backward(b, last=i == len(micro) - 1) for i, b in enumerate(micro))
        if step == opts.steps - 1:
            active = counter.active
            counting(False)  # reading bytes is not part of the step
            grads = strategy.grad_bytes()
            counting(active)
        strategy.step()
        elapsed = timer.stop()
        counting(False)
        losses.append(_global_mean(step_loss / len(micro), device))
        if rank == 0:
            print(
                f"{PROGRESS} {strategy.name} step {step + 1}/{opts.steps} loss {losses[-1]:.6f} {elapsed:.3f}s",
                flush=True,
            )
    params, optimizer = strategy.param_and_optimizer_bytes()
    return {
        "losses": losses,
        "step_times_s": timer.times,
        "median": timer.median(opts.warmup),
        "bytes": (params, grads, optimizer),
        "ds_comms_log": ds_log.summary(opts.steps - opts.warmup, world) if ds_log else None,
    }


def run_rank(strategy_name: str, opts: BenchOptions, record_path: str | None, counter: CommCounter) -> dict:
    """One rank of one strategy run. The counter must be installed before this (and before DeepSpeed)."""
    import torch
    import torch.distributed as dist

    from zero_kit.bench_record import build_record
    from zero_kit.strategies import LAUNCHER, STRATEGIES, StrategyOptions, build_strategy
    from zero_kit.train_launch import end_process_group

    torch.use_deterministic_algorithms(True, warn_only=True)
    device, pg_backend = _device_and_backend()
    if device.startswith("cuda") and opts.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 on GPU means TF32 matmuls (metrics.PEAK_FLOPS)
    backend_kind = STRATEGIES[strategy_name][0]
    _init_distributed("deepspeed" if LAUNCHER[backend_kind] == "deepspeed" else "torch", pg_backend)
    finished = False
    try:
        model = build_model(opts)
        numels = [p.numel() for p in model.parameters() if p.requires_grad]  # the order DeepSpeed flattens
        n_params = sum(p.numel() for p in model.parameters())
        options = StrategyOptions(
            precision=opts.precision,
            micro_batch=opts.micro_batch,
            grad_accum=opts.grad_accum,
            world_size=dist.get_world_size(),
            device=device,
            lr=opts.lr,
            grad_clip=opts.grad_clip,
            compile=opts.compile,
        )
        strategy = build_strategy(strategy_name, model, options)
        strategy.n_params, strategy.param_numels = n_params, numels
        result = _train(strategy, opts, counter, model.config.vocab_size, device)
        record = build_record(strategy, opts, result, model, device, counter)
        if dist.get_rank() == 0 and record_path:
            with open(record_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        finished = True
        return record
    finally:
        end_process_group(finished)


def _launch_command(strategy: str, opts: BenchOptions, index: int, record: str) -> list[str]:
    from zero_kit.launch import deepspeed_command, torchrun_command
    from zero_kit.strategies import LAUNCHER, check_name

    args = ["--strategy", strategy, "--options-json", json.dumps(dataclasses.asdict(opts)), "--record", record]
    port = opts.master_port + index
    if LAUNCHER[check_name(strategy)[0]] == "deepspeed":
        return deepspeed_command("zero_kit.bench", args, nproc=opts.nproc, master_port=port)
    return torchrun_command("zero_kit.bench", args, nproc=opts.nproc, master_port=port)


def _run_one(strategy: str, opts: BenchOptions, index: int, out_dir, progress) -> tuple[dict | None, str]:
    """Launch one strategy; returns (record or None, log path). Progress lines from rank 0 go to `progress`."""
    import subprocess
    import tempfile

    log_path = out_dir / "logs" / f"{strategy}.log"
    fd, record_path = tempfile.mkstemp(suffix=".jsonl", dir=out_dir / "logs")
    os.close(fd)
    command = _launch_command(strategy, opts, index, record_path)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n")
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        try:
            _pump(proc, log, progress, opts.timeout)
        finally:
            _stop(proc)
    with open(record_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    os.unlink(record_path)
    if proc.returncode != 0 or not lines:
        return None, str(log_path)
    record = json.loads(lines[-1])
    record["command"] = " ".join(command)
    return record, str(log_path)


def _pump(proc, log, progress, timeout: float) -> None:
    import threading

    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            log.write(line)
            if line.startswith(PROGRESS):
                progress(line[len(PROGRESS) :].strip())
        proc.wait()
    finally:
        timer.cancel()


def _stop(proc) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's own process group (start_new_session)
        proc.wait()


def run_bench(opts: BenchOptions, progress=None) -> list[dict]:
    """Every strategy as a real launch; then results.jsonl, table.md and PNG plots in opts.out."""
    from pathlib import Path

    from zero_kit.bench_report import failed_record, write_outputs
    from zero_kit.strategies import check_name

    names = [n.strip() for n in opts.strategies.split(",") if n.strip()]
    for name in names:
        check_name(name)
    model_config(opts)
    out_dir = Path(opts.out)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    records = []
    for index, name in enumerate(names):
        progress(f"[{index + 1}/{len(names)}] launching {name} on {opts.nproc} ranks")
        record, log_path = _run_one(name, opts, index, out_dir, progress)
        records.append(record or failed_record(name, opts, log_path))
    write_outputs(records, out_dir)
    return records


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of a zero-kit bench run (started by a launcher)")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--options-json", default="{}")
    parser.add_argument("--record", default=None, help="JSONL file rank 0 appends its record to")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    args = parser.parse_args(argv)
    counter = CommCounter().install()
    opts = BenchOptions(**json.loads(args.options_json))
    run_rank(args.strategy, opts, args.record, counter)
    return 0


if __name__ == "__main__":
    from zero_kit.train_launch import exit_rank

    exit_rank(worker_main())  # no interpreter teardown: see there

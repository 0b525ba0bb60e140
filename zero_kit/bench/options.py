"""Options of `zero-kit bench`: one dataclass field per flag, the docstring under a field is its `--help`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zero_kit.dist import MULTI_NODE_PORT
from zero_kit.options import Port

PROGRESS = "[zk-bench]"
"""Prefix of the progress lines rank 0 prints; the driver shows them and keeps the rest in the log."""


@dataclass(frozen=True)
class BenchOptions:
    strategies: str = "ddp,fsdp,zero1,zero2,zero3"
    """Comma-separated strategies: ddp, fsdp, zero0..zero3, zero2_offload, zero3_offload, the DeepSpeed variants
    zero1_reduce / zero2_reduce (per-owner reduce) and zero3_release (re-gather in backward), the node-aware
    zero3_hpz / zero3_hpz_release (ZeRO++ hpZ), fsdp_hsdp (2D mesh) and fsdp_reshard_node, zero3_bf16states
    (bf16 master weights, gradients and Adam moments), and model parallelism: zero1_tp (DeepSpeed AutoTP 2-way +
    ZeRO-1) and pp (2 pipeline stages, 1F1B)."""
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
    sp: int = 1
    """Ulysses sequence parallelism: each ZeRO strategy of --strategies also runs with groups of N ranks sharing every
    row, each rank holding 1/N of its tokens and exchanging attention heads all-to-all (DeepSpeed's ALST), as the row
    STRATEGY_spN beside it. It trains the same global batch in N x the micro steps, so its losses compare with its
    sp=1 row's and DDP's; --seq-len must be a multiple of N. A `_spN` name in --strategies runs one such row alone."""
    steps: int = 20
    """Optimizer steps per run (losses recorded for every one)."""
    warmup: int = 3
    """Steps excluded from timing and byte counting."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """fp32 for exact parity on CPU; bf16 on GPUs (DeepSpeed bf16 / FSDP2 MixedPrecisionPolicy / DDP autocast)."""
    lr: float = 1e-3
    """AdamW learning rate; high because the tiny model trains from scratch (the loss curve must move)."""
    gradient_clipping: float = 1.0
    """Clip gradients to this global norm in every strategy (0 disables)."""
    seed: int = 0
    """Seed of the initial weights and of the synthetic data; identical for every strategy."""
    compile: bool = False
    """torch.compile the model in every strategy."""
    zero_override: str = ""
    """zero_optimization keys for every ZeRO strategy of the run, KEY=VALUE[,KEY=VALUE...] with JSON values
    (reduce_bucket_size=4000000,overlap_comm=false): your own communication settings against DDP in one table."""
    ds_config: str | None = None
    """Your own DeepSpeed JSON FILE as one more run beside --strategies (the row ds_config:<file stem>), as written
    except: the batch keys become --micro-batch and --grad-accum, steps_per_print is raised, DeepSpeed's timers run on
    CPU only, and on CPU an Adam section uses torch's fused AdamW (not with optimizer offload). Its precision must be
    --precision's; --zero-override does not apply to it. Checked (and linted for deepspeed) before any launch."""
    ds_comms_log: bool = False
    """Also record DeepSpeed's own comms logger in ZeRO runs (a cross-check of the byte counter; it synchronizes
    after every collective, so leave it off for GPU timings)."""
    profile: bool = False
    """Write a torch.profiler chrome trace of one step per strategy (rank 0, the last warm-up step, the bench's phases
    as named ranges) to OUT/profile/STRATEGY.json."""
    out: str = "bench_out"
    """Output directory: results.jsonl, table.md, PNG plots, logs/."""
    master_port: Port = MULTI_NODE_PORT
    """First rendezvous port (1..65535); strategy i uses master_port + i (on one host, a free port where that one is
    taken)."""
    timeout: int = 600
    """Seconds allowed per strategy run before it is killed and reported failed."""
    stall_timeout: float = 300
    """End a strategy's run (reported failed, the stall watchdog's report in its log) when no rank has made progress
    for this many seconds; start-up may take 6x as long; 0 disables (--timeout still bounds the run)."""
    hostfile: str | None = None
    """Hostfile ('HOST slots=N' per line): run every strategy across its hosts (ZeRO: deepspeed over pdsh/ssh;
    DDP/FSDP2: torchrun on each host over ssh). --out must be on a filesystem every host shares."""
    nodes: int | None = None
    """Nodes of the SLURM allocation (with --slurm)."""
    gpus_per_node: int | None = None
    """Ranks per node in a multi-node run (default: the hostfile's slots, else --nproc). On one host, a divisor of
    --nproc makes the ranks count as --nproc / L nodes (link tiers, hpZ and HSDP groups)."""


def parse_zero_override(text: str) -> dict:
    """`--zero-override` as a dict; UserError naming the item and the key when an item is no KEY=VALUE of
    DeepSpeed's zero_optimization (its own pydantic model: a misspelt key would otherwise change nothing)."""
    import json

    from zero_kit.errors import UserError, raise_all

    found, problems = {}, []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(UserError(f"--zero-override {item!r}: not KEY=VALUE", "e.g. reduce_bucket_size=4000000"))
            continue
        try:
            found[key.strip()] = json.loads(value)
        except ValueError:
            found[key.strip()] = value.strip()
    if found:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        known = set(DeepSpeedZeroConfig.model_fields) | {
            f.alias for f in DeepSpeedZeroConfig.model_fields.values() if f.alias
        }
        for key in sorted(set(found) - known):
            problems.append(UserError(f"--zero-override {key}: not a zero_optimization key of DeepSpeed",
                                      "use a key of DeepSpeed's zero_optimization section (docs/configs.md)"))  # fmt: skip
    raise_all(problems, "in --zero-override")
    return found


def strategy_names(opts: BenchOptions) -> list[str]:
    """The runs of --strategies in order, with --sp N's `_spN` row right after each ZeRO strategy that has one
    (strategies.sequence_parallel_name); a name the registry does not know is left for check_name to refuse."""
    from zero_kit.errors import UserError
    from zero_kit.strategies import sequence_parallel_name, strategy_info

    names = [n.strip() for n in opts.strategies.split(",") if n.strip()]
    if opts.sp == 1:
        return names
    if opts.sp < 1:
        raise UserError(f"--sp {opts.sp}: a sequence-parallel group is 1 rank or more", "e.g. --sp 2")
    runs = []
    for name in names:
        info = strategy_info(name)
        variant = sequence_parallel_name(info, opts.sp) if info else None
        runs += [name] + ([variant] if variant and variant not in names else [])
    if not [name for name in runs if name.endswith(f"_sp{opts.sp}")]:
        raise UserError(f"--sp {opts.sp} adds a sequence-parallel row to each ZeRO strategy of --strategies, and"
                        f" {opts.strategies!r} has none", "add zero2 or zero3 to --strategies (e.g. ddp,zero3)")  # fmt: skip
    return runs

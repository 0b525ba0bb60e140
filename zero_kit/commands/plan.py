"""`zero-kit plan`: which of DDP, FSDP2, ZeRO-0..3 and the offload variants fit a LLaMA-style model on given
GPUs, and which is expected fastest. Reads the model's config.json (or a known shape, or --params), prints a
table in GiB (or --json in bytes), and with -o writes the DeepSpeed config of the recommended option."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from zero_kit.errors import UserError
from zero_kit.options import add_dataclass_arguments, dataclass_from_args


@dataclass(frozen=True)
class PlanOptions:
    model: str | None = None
    """Local Hugging Face model directory (its config.json is read), a Hub id (org/name) in the Hugging Face cache
    (HF_HUB_OFFLINE=0: its config.json is downloaded if not), or a known shape such as llama-3-8b."""
    params: str | None = None
    """Parameter count instead of --model, e.g. 8e9, 7B or 70b; dimensions default to the closest known shape."""
    hidden_size: int | None = None
    """With --params: hidden size h."""
    layers: int | None = None
    """With --params: number of decoder layers L."""
    heads: int | None = None
    """With --params: attention heads (default h/128)."""
    kv_heads: int | None = None
    """With --params: key/value heads for grouped-query attention (default: --heads)."""
    intermediate_size: int | None = None
    """With --params: MLP intermediate size (default about 8h/3, rounded up to 256)."""
    vocab: int | None = None
    """With --params: vocabulary size (default 32000)."""
    gpu_mem: str | None = None
    """Memory of one GPU: 80GB (10^9 bytes), 80GiB or 80G (2^30 bytes). Required."""
    gpus_per_node: int = 1
    """GPUs per node."""
    nodes: int = 1
    """Number of nodes."""
    host_mem: str | None = None
    """Host RAM per node (same units as --gpu-mem); checks that offload fits. Unchecked when left out."""
    inter_node_gbps: float | None = None
    """Inter-node bandwidth per node in Gbit/s per direction (default: the --gpu table's); below 100, options
    sending fewer bytes rank first."""
    intra_node_gbps: float | None = None
    """Intra-node bandwidth per GPU in Gbit/s per direction (NVLink 4: 3600 = 450 GB/s; default: the --gpu
    table's)."""
    latency_us: float = 20.0
    """Latency per collective call in microseconds (the alpha of the alpha-beta model)."""
    mfu: float | None = None
    """Model FLOPs utilisation of the compute, in (0, 1] (default 0.40, Llama 3 on H100); not with --calibrate."""
    gpu: Literal["h100", "h200", "h100-pcie", "a100", "l40s", "a10g"] = "h100"
    """GPU type for the step-time model's defaults: peak FLOP/s, NVLink/PCIe and typical inter-node bandwidth
    (zero_kit.plan.rates)."""
    calibrate: str | None = None
    """A `zero-kit bench` results.jsonl: the achieved FLOP/s of its DDP (else ZeRO-0) record replace peak x MFU;
    for the same model, sequence and micro batch, each strategy's measured overhead per step is added too."""
    gpu_record: str | None = None
    """A GPU suite's suite.jsonl (`python -m benchmarks.gpu.suite`): the CUDA context + NCCL memory and the allocator slack
    it measured replace the stated constants (an --assume of the same key wins)."""
    comm_backend: Literal["nccl", "gloo"] = "nccl"
    """Collective library, for its algorithms: nccl (GPUs), or gloo (CPU ranks: a reduce-scatter is an
    all-reduce)."""
    rank_by: Literal["memory", "time"] = "memory"
    """Recommend by the memory model's ranking (no offload, fewer bytes sent) or by predicted step time."""
    assume: str | None = None
    """Override stated constants, comma-separated KEY=VALUE: cuda_context_nccl_gib, allocator_slack,
    host_baseline_gib, overlap, pcie_gbs, cpu_mem_gbs, cpu_adam_bytes."""
    seq_len: int = 2048
    """Sequence length in tokens."""
    micro_batch: int = 1
    """Micro batch per GPU."""
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Training precision: bf16/fp16 mixed precision with fp32 Adam states, or plain fp32."""
    lora_r: int | None = None
    """LoRA rank: frozen base weights (16-bit) plus adapters on every linear of each block."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer in backward instead of keeping its activations."""
    tiled_compute: bool = False
    """DeepSpeed's tiled MLP and tiled logits-loss (zero-kit train --tiled-compute): the MLP's intermediate tensors and
    the fp32 logits for one slice of the sequence at a time."""
    sp: int = 1
    """Ulysses sequence parallelism (zero-kit train --sp): each GPU holds seq_len / sp tokens of every sequence, so
    its activations, logits and compute are those of seq_len / sp; it must divide --gpus-per-node. Data-parallel
    layouts only. Its all-to-alls (4 per layer, in forward and backward) are in the bytes sent and the step time."""
    method: Literal["sft", "dpo"] = "sft"
    """dpo: preference tuning (zero-kit train --method dpo): two sequences per pair (--micro-batch counts pairs) and
    a frozen reference model (its weights per rank; LoRA: none) whose forward each step runs too. Data-parallel
    layouts only."""
    dpo_reference: Literal["auto", "model", "precompute"] = "auto"
    """--method dpo's reference (zero-kit train --dpo-reference): model charges a frozen copy's weights and its forward
    every step; precompute charges neither (the log-probabilities are computed once before training; that one-off
    time is given per 1,000 pairs). auto: as model
    (a run shorter than one pass over the pairs keeps the model; a longer one precomputes and needs less)."""
    margin: float = 0.10
    """Fraction of GPU memory kept free for spikes and fragmentation."""
    tp: int | None = None
    """Plan this tensor-parallel size (DeepSpeed AutoTP / FSDP2 + DTensor) instead of the default layouts (tp = the
    GPUs of one node, a pipeline stage per node); 1 with --pp for a pipeline alone."""
    pp: int | None = None
    """Plan this many pipeline stages (torch.distributed.pipelining, 1F1B) instead of the default layouts."""
    pp_micro_batches: int | None = None
    """Micro batches per step of each model-parallel replica (default tp x pp: the flat options' global batch)."""
    model_parallel: bool = True
    """Plan tensor/pipeline layouts beside data parallelism (--no-model-parallel: data parallelism alone)."""
    longest: bool = False
    """Also find, for every data-parallel option, the longest --seq-len that fits at this micro batch and these flags
    (in steps of --sp), and the terms that set the limit."""
    json: bool = False
    """Print a JSON object (bytes) instead of the table."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, PlanOptions)
    parser.add_argument(
        "-o", "--output", metavar="CONFIG", help="write the DeepSpeed JSON config of the recommended option here"
    )
    parser.add_argument(
        "--force", action="store_true", help="let -o replace a file that is not a DeepSpeed JSON zero-kit wrote"
    )


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)(B?)\s*$", re.IGNORECASE)


def parse_size(text: str, flag: str) -> int:
    """80GB -> 80e9 bytes; 80GiB and 80G -> 80 x 2^30 (a bare unit letter is binary, as in `free -g`)."""
    match = _SIZE.match(text)
    if not match or not match.group(2):
        raise UserError(f"{flag} {text!r} is not a size", f"write it like 80GB, 80GiB or 24G, e.g. {flag} 80GB")
    number, unit, binary, byte = match.groups()
    power = "KMGT".index(unit.upper()) + 1
    base = 1000 if (byte and not binary) else 1024
    return int(float(number) * base**power)


def parse_count(text: str) -> int:
    """8e9, 8B, 8b, 1.1B, 350M -> parameters."""
    match = re.match(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([KMBT]?)\s*$", text, re.IGNORECASE)
    if not match:
        raise UserError(f"--params {text!r} is not a parameter count", "write it like 8e9, 8B or 350M")
    scale = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def resolve_model(opts: PlanOptions):
    """(label, shape, n_params) from --model DIR, --model NAME or --params with optional dimensions."""
    from zero_kit.plan import KNOWN_SHAPES, LlamaShape, closest_known_shape

    if (opts.model is None) == (opts.params is None):
        raise UserError("give exactly one of --model and --params", "e.g. --model llama-3-8b or --params 8e9")
    if opts.model is not None:
        if opts.model.lower() in KNOWN_SHAPES:
            shape = KNOWN_SHAPES[opts.model.lower()]
            return opts.model.lower(), shape, shape.n_params
        shape = _shape_from_dir(opts.model, list(KNOWN_SHAPES))
        return str(opts.model), shape, shape.n_params
    n_params = parse_count(opts.params)
    if n_params < 1:
        raise UserError(f"--params must be positive, got {opts.params}", "e.g. --params 8e9")
    if opts.hidden_size is None and opts.layers is None:
        name, shape = closest_known_shape(n_params)
        return f"--params {opts.params} with {name} dimensions", shape, n_params
    if opts.hidden_size is None or opts.layers is None:
        raise UserError("--hidden-size and --layers go together", "give both, or neither to use a known shape")
    h, heads = opts.hidden_size, opts.heads or max(1, opts.hidden_size // 128)
    inter = opts.intermediate_size or -(-8 * h // 3 // 256) * 256
    shape = LlamaShape(h, opts.layers, heads, opts.kv_heads or heads, inter, opts.vocab or 32000)
    return f"--params {opts.params} with the given dimensions", shape, n_params


def _shape_from_dir(model: str, known: list[str]):
    """The LlamaShape of a local model directory's config.json; every way it can be wrong is one UserError."""
    from zero_kit.errors import read_text
    from zero_kit.plan import shape_from_hf_config

    config_path = _hub_config(model) or Path(model) / "config.json"
    if not config_path.is_file():
        raise UserError(
            f"--model {model!r} is neither a directory with config.json nor a known shape",
            f"pass a local model directory or one of: {', '.join(known)}",
        )
    text = read_text(config_path, "--model", "a Hugging Face model directory whose config.json is JSON")
    try:
        config = json.loads(text)
    except ValueError as err:
        raise UserError(f"--model {config_path}: not JSON ({err})", "fix or replace the model's config.json") from None
    if not isinstance(config, dict):
        raise UserError(f"--model {config_path}: not a JSON object", "fix or replace the model's config.json")
    try:
        return shape_from_hf_config(config)
    except UserError as err:  # an unsupported architecture: say which file
        raise UserError(f"--model {config_path}: {err.message}", err.fix) from None
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(
            f"--model {config_path}: cannot read a LLaMA-style shape (missing or bad key {err})",
            "check config.json, or give the size with --params N",
        ) from None


def _hub_config(model: str) -> Path | None:
    """A Hub id's (org/name) config.json: from the Hugging Face cache, or (HF_HUB_OFFLINE=0) downloaded alone,
    which is all the planner reads; None for a local path."""
    from zero_kit.model import hub_config_file, hub_id

    repo = hub_id(model)
    return None if repo is None else hub_config_file(repo, download=True)


def _timing_problems(opts: PlanOptions) -> list[UserError]:
    problems = []
    for flag, value in (
        ("--inter-node-gbps", opts.inter_node_gbps),
        ("--intra-node-gbps", opts.intra_node_gbps),
        ("--latency-us", opts.latency_us),
    ):
        bad = value is not None and (value < 0 if flag == "--latency-us" else value <= 0)
        if bad:
            bound = "0 or more" if flag == "--latency-us" else "positive"
            problems.append(UserError(f"{flag} must be {bound}, got {value:g}", f"e.g. {flag} 100, or leave it out"))
    if opts.mfu is not None and not 0 < opts.mfu <= 1:
        problems.append(UserError(f"--mfu must be in (0, 1], got {opts.mfu:g}", "e.g. --mfu 0.4"))
    if opts.mfu is not None and opts.calibrate:
        problems.append(UserError("--mfu and --calibrate both set the compute rate", "give one of them"))
    return problems


def read_calibration(path: str, rates) -> tuple[object, list[UserError]]:
    """(Calibration or None, problems) from a `zero-kit bench` results.jsonl, its comm taken at `rates`."""
    from zero_kit.plan.calibration import calibrate

    file = Path(path)
    if not file.is_file():
        return None, [
            UserError(f"--calibrate {path}: no such file", "pass the results.jsonl of a `zero-kit bench` run")
        ]
    records = read_jsonl(file, "--calibrate", "the results.jsonl of a `zero-kit bench` run")
    found = calibrate(records, file.name, rates)
    if found is None:
        fix = "run `zero-kit bench --strategies ddp ...` and pass its results.jsonl"
        why = "a ddp or zero0 record with flops_per_token and tokens_per_s.per_rank"
        return None, [UserError(f"--calibrate {path}: no usable record ({len(records)} read; need {why})", fix)]
    return found, []


def read_jsonl(file: Path, flag: str, what: str) -> list:
    from zero_kit.errors import read_text

    records = []
    for line in read_text(file, flag, what).splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line of an interrupted run: the other records still count
        if isinstance(record, dict):
            records.append(record)
    return records


def read_gpu_record(path: str, assume, items: list[str]):
    """(Assumptions with the measured constants, problems): keys given with --assume stay as given."""
    from dataclasses import replace

    from zero_kit.plan.assumptions import measured_on_gpu

    file = Path(path)
    fix = "pass the suite.jsonl of `python -m benchmarks.gpu.suite` run on a GPU"
    if not file.is_file():
        return assume, [UserError(f"--gpu-record {path}: no such file", fix)]
    try:
        values, source = measured_on_gpu(read_jsonl(file, "--gpu-record", "a GPU suite's suite.jsonl"))
    except ValueError as e:
        return assume, [UserError(f"--gpu-record {path}: {e}", fix)]
    given = {item.partition("=")[0].strip().replace("-", "_") for item in items}
    taken = {k: v for k, v in values.items() if k not in given}
    if taken:
        shown = ", ".join(f"{k}={v:.3g}" for k, v in taken.items())
        print(f"zero-kit plan: {shown} {source} ({path})", file=sys.stderr)
    return replace(assume, **taken), []


def build_rates(opts: PlanOptions, assume, precision: str):
    from zero_kit.plan.rates import DEFAULT_MFU, GBIT, GPU_SPECS, Rates, peak_of

    spec = GPU_SPECS[opts.gpu]
    mfu = opts.mfu or DEFAULT_MFU
    flops = peak_of(spec, precision) * mfu
    source = f"{spec.name} {precision} peak {peak_of(spec, precision) / 1e12:g} TFLOP/s x MFU {mfu:g}"
    return Rates(
        flops_per_s=flops,
        intra_bytes_per_s=(opts.intra_node_gbps or spec.intra_gbps) * GBIT,
        inter_bytes_per_s=(opts.inter_node_gbps or spec.inter_gbps) * GBIT,
        latency_s=opts.latency_us * 1e-6,
        pcie_bytes_per_s=(assume.pcie_gbs or spec.pcie_gbs) * 1e9,
        cpu_mem_bytes_per_s=assume.cpu_mem_gbs * 1e9,
        cpu_adam_bytes=assume.cpu_adam_bytes,
        overlap=assume.overlap,
        compute_source=source,
        comm_backend=opts.comm_backend,
    )


def build_inputs(opts: PlanOptions):
    from zero_kit.errors import raise_all
    from zero_kit.plan import Hardware, Workload
    from zero_kit.plan.assumptions import parse_assume

    problems = _timing_problems(opts)
    items = [item for item in (opts.assume or "").split(",") if item.strip()]
    assume, assume_problems = parse_assume(items)
    problems += [UserError(text, "see zero-kit plan --help for the keys") for text in assume_problems]
    if opts.gpu_record:
        assume, found = read_gpu_record(opts.gpu_record, assume, items)
        problems += found
    rates = build_rates(opts, assume, opts.precision)
    calibration = None
    if opts.calibrate:
        calibration, found = read_calibration(opts.calibrate, rates)
        problems += found
    if opts.gpu_mem is None:
        problems.insert(0, UserError("--gpu-mem is required", "e.g. --gpu-mem 80GB"))
    raise_all(problems, "in the flags of zero-kit plan")
    for flag, value in (("--gpus-per-node", opts.gpus_per_node), ("--nodes", opts.nodes)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}", f"pass {flag} 1 or more")
    for flag, value in (("--seq-len", opts.seq_len), ("--micro-batch", opts.micro_batch), ("--sp", opts.sp)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}", f"pass {flag} 1 or more")
    if not 0 <= opts.margin < 1:
        raise UserError(f"--margin must be in [0, 1), got {opts.margin}", "e.g. --margin 0.1")
    if opts.gpus_per_node % opts.sp or opts.seq_len % opts.sp:
        raise UserError(f"--sp {opts.sp} must divide --gpus-per-node ({opts.gpus_per_node}: a group stays in one node) "
                        f"and --seq-len ({opts.seq_len})", "pass an --sp that divides both")  # fmt: skip
    label, shape, n_params = resolve_model(opts)
    work = Workload(shape, n_params, opts.seq_len, opts.micro_batch, opts.precision, opts.lora_r,
                    opts.activation_checkpointing, preference=opts.method == "dpo", sp=opts.sp,
                    reference_precomputed=opts.method == "dpo" and opts.dpo_reference == "precompute",
                    tiled=opts.tiled_compute)  # fmt: skip
    host = parse_size(opts.host_mem, "--host-mem") if opts.host_mem else None
    hardware = Hardware(
        parse_size(opts.gpu_mem, "--gpu-mem"),
        opts.gpus_per_node,
        opts.nodes,
        host,
        opts.inter_node_gbps,
        opts.margin,
        assume,
    )
    if calibration is not None:
        from zero_kit.plan.calibration import apply

        rates = apply(calibration, rates, work)
    from zero_kit.plan.parallel_options import layouts_from_flags

    if work.preference and (opts.tp or opts.pp):
        raise UserError("--method dpo is planned for data-parallel layouts only", "drop --tp/--pp")
    if work.sp > 1 and (opts.tp or opts.pp):
        raise UserError(f"--sp {work.sp} is planned for data-parallel layouts only", "drop --tp/--pp, or --sp")
    flags = (opts.tp, opts.pp, opts.pp_micro_batches, opts.model_parallel and not work.preference and work.sp == 1)
    return label, work, hardware, rates, layouts_from_flags(*flags, work, hardware)


def run(args: argparse.Namespace) -> int:
    from zero_kit.plan import make_plan, render_json, render_text

    opts = dataclass_from_args(PlanOptions, args)
    if args.output:  # before the planning, so a wrong -o costs nothing and the table is not printed for naught
        from zero_kit.commands.config import check_output

        check_output(args.output, "-o", args.force)
    label, work, hardware, rates, layouts = build_inputs(opts)
    plan = make_plan(work, hardware, rates, opts.rank_by, layouts)
    if opts.longest:
        from zero_kit.plan.recommend import longest_sequences

        plan = replace(plan, longest=longest_sequences(work, hardware))
    print(render_json(plan, label) if opts.json else render_text(plan, label))
    if plan.recommended is None:
        if not opts.json:
            print("zero-kit plan: refused: nothing fits (see above)", file=sys.stderr)
        return 1
    if args.output:
        write_config(plan, opts, args.output, args.force)
    return 0


def write_config(plan, opts: PlanOptions, path: str, force: bool = False) -> None:
    """The recommended option's DeepSpeed config through the generator (FSDP2 -> ZeRO-3, DDP -> ZeRO-0: the
    registry's `stage` of a native strategy is the ZeRO stage that shards the same states)."""
    from zero_kit.commands.config import write_config as write_json
    from zero_kit.config.builder import build_ds_config, dumps
    from zero_kit.config.spec import ZeroSpec

    best = plan.recommended
    info = best.info
    stage = info.stage
    layout = best.layout
    if info.backend != "deepspeed":
        print(
            f"zero-kit plan: {best.label} is not DeepSpeed; wrote the nearest ZeRO equivalent, stage {stage}",
            file=sys.stderr,
        )
    if layout is not None and layout.pp > 1:
        print(
            f"zero-kit plan: the {layout.pp} pipeline stages are your script's (torch.distributed.pipelining, "
            f"{layout.micro_batches} micro batches); the JSON holds the data-parallel part",
            file=sys.stderr,
        )
    spec = ZeroSpec(
        stage=stage,
        offload_optimizer="cpu" if info.offload_optimizer else "none",
        offload_param="cpu" if info.offload_param else "none",
        precision=opts.precision,
        micro_batch=opts.micro_batch,
        grad_accum=layout.micro_batches if layout is not None and layout.pp == 1 else 1,
        world_size=plan.hardware.world_size,
        hidden_size=plan.work.shape.hidden_size,
        tp=layout.tp if layout is not None else 1,
    )
    write_json(path, dumps(build_ds_config(spec)), "-o", force)
    print(f"zero-kit plan: wrote {path} (ZeRO stage {stage}, {best.offload} offload)", file=sys.stderr)

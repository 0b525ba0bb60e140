"""One `zero-kit train` run, resolved once: the `RunPlan`.

The process that starts the job (zero_kit.train.parent) makes it with `plan_run`, before any rank exists: the world
and per-node sizes, the data-parallel size, the host's device kind, the precision, the DeepSpeed dict (generated, or
read from --ds-config and linted), the ZeRO stage, the learning rate, the checkpoint it resumes and the output's
claim. The plan is torch-free and travels to the ranks of its launch as JSON (PLAN_ENV); a rank (zero_kit.train.rank)
reads it and derives none of those values again. Under an outside launcher (torchrun, deepspeed, srun) each rank is
its own starting process and makes the same plan, once, with the same function.

    plan = plan_run(opts, dict(os.environ), this_host())    # the starting process
    plan = RunPlan.from_env(os.environ)                      # a rank of its launch
"""

from __future__ import annotations

import base64
import dataclasses
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zero_kit.dist import local_size_from_env, world_size_from_env
from zero_kit.errors import UserError
from zero_kit.plan.assumptions import Assumptions
from zero_kit.plan.shapes import LlamaShape
from zero_kit.plan.workload import Workload
from zero_kit.train.options import TrainOptions, default_lr, zero_spec
from zero_kit.train.resume import resume_target

PLAN_ENV = "ZERO_KIT_PLAN"
r"""The starting process's plan in the environment of the ranks it launches: JSON, zlib-compressed, in URL-safe
base64. Ranks on other hosts get it on DeepSpeed's pdsh command line (`export NAME=VALUE;`), which double-quotes a
value with any character outside [\w@%+=:,./-] and would break JSON's own quotes; base64's letters need none."""


@dataclass(frozen=True)
class Host:
    """What the plan needs of the machine the ranks train on."""

    on_gpu: bool
    bf16_supported: bool
    """The GPU computes in bf16 (Ampere or newer): what `--precision auto` picks there."""

    @property
    def backend(self) -> str:
        """The process-group backend: "nccl" on a GPU, "gloo" on the CPU."""
        return "nccl" if self.on_gpu else "gloo"

    @classmethod
    def of_device(cls, device: str) -> Host:
        """A host whose ranks train on `device` ("cpu", "cuda" or "cuda:N"): on a GPU torch says whether it computes
        in bf16. What `this_host` and `zero_kit.hf.training_arguments` both decide with."""
        if device == "cpu":
            return cls(on_gpu=False, bf16_supported=False)
        import torch

        return cls(on_gpu=True, bf16_supported=torch.cuda.is_bf16_supported())


def this_host() -> Host:
    """This host's device kind: a host without a GPU driver is told without importing torch (a CPU run's checks
    stay fast); on a GPU host torch says whether CUDA works and computes in bf16. The ranks of a hostfile are taken
    to run on hosts like this one; each rank checks that its own device agrees (zero_kit.train.rank)."""
    from zero_kit.dist import gpu_host

    if not gpu_host():
        return Host.of_device("cpu")
    import torch

    return Host.of_device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class PlannerView:
    """The run in the planner's words (zero_kit.plan), as the memory checks need it."""

    workload: Workload
    strategy: str
    """The byte-table row: zero0 .. zero3."""
    offload: str
    """What sits in host RAM: "none", "optimizer" or "optimizer+param" (NVMe offload keeps states on disk)."""
    ranks_per_node: int
    nodes: int
    assume: Assumptions = Assumptions()
    """The planner's stated constants; `zero-kit train` has no --assume flag, so these are the defaults."""


@dataclass(frozen=True)
class RunPlan:
    options: TrainOptions
    """The flags, with the concrete numbers (and enabled precision) of a --ds-config file in place of flags left at
    their defaults: read once from the file, never from a generated dict. What the run record keeps."""
    world_size: int
    """Ranks in the job, all nodes together."""
    ranks_per_node: int
    """Ranks on the fullest node: --nproc, the hostfile's slots (capped at --nproc), or the launcher's
    LOCAL_WORLD_SIZE / LOCAL_SIZE."""
    nodes: int
    dp_size: int
    """Data-parallel ranks: the sequence-parallel groups, world_size / sp (`dp_size_of`). Each group trains its own
    batches; ZeRO shards the states over every rank."""
    on_gpu: bool
    precision: str
    """"bf16", "fp16" or "fp32": what TrainingArguments, preflight and the MFU figure use."""
    ds_config: dict[str, Any]
    from_file: bool
    """The DeepSpeed dict came from --ds-config (linted) rather than the generator."""
    zero_stage: int
    learning_rate: float
    nvme_dirs: tuple[tuple[str, str], ...]
    """(where it was set: --nvme-path or the file's key path, directory) of each NVMe offload."""
    resume_from: str | None = None
    """The complete checkpoint the run continues (None: it starts fresh). Chosen only: nothing is deleted for it."""
    claim_token: str | None = None
    """The output's claim, held by the starting process (zero_kit.checkpoints.claim): its ranks check it is theirs."""
    dpo_precompute: bool | None = None
    """--method dpo: whether the reference log-probabilities are precomputed (zero_kit.train.preference
    `choose_reference`, decided once the pairs are prepared and counted and said with its reason then; None before
    that, or for sft)."""

    @property
    def output(self) -> Path:
        return Path(self.options.output)

    @property
    def micro_batch(self) -> int:
        return self.options.micro_batch

    @property
    def grad_accum(self) -> int:
        return self.options.grad_accum

    @property
    def backend(self) -> str:
        return "nccl" if self.on_gpu else "gloo"

    def planner(self, shape: LlamaShape | None = None) -> PlannerView:
        """The run in the planner's words (`shape`: the model's, when it was read already)."""
        work = workload_of(self.options, self.precision, shape, precomputed=bool(self.dpo_precompute))
        return planner_view(self.ds_config, work, self.zero_stage, self.ranks_per_node, self.nodes)

    def to_env(self) -> dict[str, str]:
        packed = zlib.compress(json.dumps(dataclasses.asdict(self)).encode("utf-8"))
        return {PLAN_ENV: base64.urlsafe_b64encode(packed).decode("ascii")}

    @classmethod
    def from_env(cls, environ) -> RunPlan | None:
        """The plan a starting process handed to this rank; None in a process that starts the job itself."""
        raw = environ.get(PLAN_ENV)
        if not raw:
            return None
        fields = json.loads(zlib.decompress(base64.urlsafe_b64decode(raw)))
        fields["options"] = TrainOptions(**fields["options"])
        fields["nvme_dirs"] = tuple(tuple(pair) for pair in fields["nvme_dirs"])
        return cls(**fields)


def plan_run(opts: TrainOptions, environ: dict[str, str], host: Host, *, claim_token: str | None = None) -> RunPlan:
    """Every decision of a run, once. `opts` has passed `check_options` (and names the resolved model directory);
    `environ`: the starting process's (a launcher's sizes, when it is a rank of one); `host`: the device kind the
    ranks train on. Raises UserError for a config or flags this run cannot use."""
    world, per_node, nodes = launch_sizes(opts, environ)
    work = workload_of(opts, "fp32")  # the shape only: precision changes no width
    ds_config = trainer_ds_config(opts, torch_adam=not host.on_gpu, device="cuda" if host.on_gpu else "cpu",
                                  hidden_size=work.shape.hidden_size,
                                  trainable=work.trainable_params or work.n_params)  # fmt: skip
    from_file = opts.ds_config is not None
    options = adopt_file_values(opts, ds_config) if from_file else opts
    file_decided = options.precision != opts.precision  # --precision auto, and the file enables bf16 or fp16
    precision = resolve_precision(options.precision, host, from_file_path=opts.ds_config if file_decided else None)
    target = resume_target(options)
    return RunPlan(
        options=options,
        world_size=world,
        ranks_per_node=per_node,
        nodes=nodes,
        dp_size=dp_size_of(world, options.sp, per_node if nodes > 1 else world),
        on_gpu=host.on_gpu,
        precision=precision,
        ds_config=ds_config,
        from_file=from_file,
        zero_stage=zero_stage_of(ds_config),
        learning_rate=default_lr(options),
        nvme_dirs=nvme_dirs(ds_config, from_file),
        resume_from=None if target is None else str(target),
        claim_token=claim_token,
    )


def dp_size_of(world: int, sp: int, per_node: int | None = None) -> int:
    """The data-parallel size of a run's `world` ranks in sequence-parallel groups of `sp`: the generator's own
    arithmetic (zero_kit.config.builder.data_parallel_size, the one place it is computed). DeepSpeed groups
    consecutive ranks, so with `per_node` ranks on each node a group stays inside one node (its all-to-all on the fast
    links) when `sp` divides `per_node`."""
    from zero_kit.config.builder import data_parallel_size

    dp_size = data_parallel_size(world, sp, "the job's ranks")
    if per_node is not None and per_node % sp:
        raise UserError(f"--sp {sp} does not divide the {per_node} rank(s) per node: a sequence-parallel group would "
                        "span two nodes, its all-to-all on the slow link",
                        f"pass an --sp that divides {per_node}")  # fmt: skip
    return dp_size


def launch_sizes(opts: TrainOptions, environ: dict[str, str]) -> tuple[int, int, int]:
    """(world size, ranks on the fullest node, nodes) as the launch will have them: a launcher's WORLD_SIZE (also
    SLURM's, translated) with its LOCAL_WORLD_SIZE / LOCAL_SIZE; else the hostfile's slots, each capped at --nproc
    (the deepspeed launcher's --num_gpus); else --nproc on this host; else one rank."""
    try:
        launched, _ = world_size_from_env(environ)
    except ValueError as err:
        fix = "start the ranks with deepspeed, torchrun or srun"
        raise UserError(f"the launcher's environment: {err}", fix) from None
    if launched:
        per_node = min(local_size_from_env(environ) or launched, launched)
        return launched, per_node, max(1, launched // per_node)
    if opts.hostfile:
        from zero_kit.launch import read_hostfile

        slots = [min(n, opts.nproc) if opts.nproc else n for _, n in read_hostfile(opts.hostfile)]
        return sum(slots), max(slots), len(slots)
    ranks = opts.nproc or 1
    return ranks, ranks, 1


def trainer_ds_config(opts: TrainOptions, *, torch_adam: bool = False, device: str | None = None,
                      hidden_size: int | None = None, trainable: int | None = None) -> dict:  # fmt: skip
    """The DeepSpeed dict: generated from `--stage` and friends ("auto" values, filled by the Trainer), or the
    linted `--ds-config`; the one step `plan_run` and `zero_kit.hf.deepspeed_config` both take. `opts` has passed
    `check_options`. `torch_adam`: the run is on CPU, where an Adam section without optimizer offload should use
    torch's AdamW (see `RunAdjustments.torch_adam`). `device`: the run's device ("cuda" or "cpu"; None: unknown), so
    a file with CUDA-only features (ZeRO++ qwZ/qgZ) is refused on a CPU run before any work, and the generator
    decides overlap_comm for it. `hidden_size` (the model's): the measured buckets
    (zero_kit.config.builder.measured_buckets) as numbers instead of "auto", which the Trainer fills with h², no
    reduce bucket larger than the `trainable` parameters."""
    from zero_kit.config.builder import RunAdjustments, build_ds_config, measured_buckets, on_cpu_ranks

    if opts.ds_config is None:
        spec = zero_spec(opts, device)
        buckets = measured_buckets(spec.stage, hidden_size, trainable, spec.device) if hidden_size else {}
        return build_ds_config(spec, RunAdjustments(torch_adam=torch_adam, zero_overrides=buckets))
    from zero_kit.lint import LintContext, load_checked

    config = load_checked(opts.ds_config, LintContext(target="hf-trainer", device=device), "--ds-config")
    return on_cpu_ranks(config) if torch_adam else config


def adopt_file_values(opts: TrainOptions, config: dict) -> TrainOptions:
    """A --ds-config file's concrete values win over flags left at their defaults (the HF Trainer refuses a config
    whose batch, optimizer or precision values differ from its own arguments); a flag given with another value
    than the file's is refused, every such pair named at once."""
    defaults = TrainOptions()
    concrete = file_values(config)
    given = {k: v for k, v in concrete.items() if getattr(opts, k) != getattr(defaults, k)}
    conflicts = [
        f"--{k.replace('_', '-')} {getattr(opts, k)} vs {v} in the file"
        for k, v in given.items()
        if getattr(opts, k) != v
    ]
    if conflicts:
        raise UserError(
            f"--ds-config {opts.ds_config} sets values that differ from the flags: {'; '.join(conflicts)}",
            'drop those flags, or write "auto" in the file so the flags decide',
        )
    return dataclasses.replace(opts, **{k: v for k, v in concrete.items() if k not in given})


def file_values(config: dict) -> dict[str, Any]:
    """The options a config file decides (option name -> value): its concrete numbers, and the precision it
    enables. "auto" and absent keys decide nothing."""
    optimizer = config.get("optimizer")
    params = optimizer.get("params", {}) if isinstance(optimizer, dict) else {}
    params = params if isinstance(params, dict) else {}
    sources = {
        "micro_batch": config.get("train_micro_batch_size_per_gpu"),
        "grad_accum": config.get("gradient_accumulation_steps"),
        "lr": params.get("lr"),
        "weight_decay": params.get("weight_decay"),
        "gradient_clipping": config.get("gradient_clipping"),
    }
    found: dict[str, Any] = {
        k: v for k, v in sources.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    enabled = [name for name in ("bf16", "fp16") if _enabled(config, name)]
    if len(enabled) == 1:  # both enabled is a lint error, refused before this
        found["precision"] = enabled[0]
    return found


def _enabled(config: dict, name: str) -> bool:
    keys = ("bf16", "bfloat16") if name == "bf16" else (name,)
    return any(isinstance(config.get(key), dict) and config[key].get("enabled") is True for key in keys)


def resolve_precision(choice: str, host: Host, *, from_file_path: str | None = None) -> str:
    """auto: bf16 on a GPU that supports it, else fp16 on a GPU, fp32 on the CPU. bf16/fp16 need a GPU.
    `from_file_path`: the choice came from that --ds-config file (its message names the file, not the flag)."""
    if choice == "auto":
        if not host.on_gpu:
            return "fp32"
        return "bf16" if host.bf16_supported else "fp16"
    if choice in ("bf16", "fp16") and not host.on_gpu:
        if from_file_path is not None:
            raise UserError(
                f"--ds-config {from_file_path} enables {choice}, which needs a GPU; this host has none",
                f'set {choice}.enabled to false (or "auto") in the file to train in fp32 on CPU',
            )
        raise UserError(
            f"--precision {choice} needs a GPU; this host has none", "use --precision fp32 (or auto) on CPU"
        )
    return choice


def zero_stage_of(ds_config: dict) -> int:
    """The ZeRO stage a DeepSpeed dict asks for (0 without a zero_optimization section)."""
    zero = ds_config.get("zero_optimization")
    return int(zero.get("stage", 0)) if isinstance(zero, dict) else 0


def model_config_dict(opts: TrainOptions) -> dict | None:
    """--model's config.json as a dict (the embedded model's constants for None), read without transformers; None
    when it cannot be read (the input checks name that problem)."""
    from zero_kit.model import TINY_DEFAULTS, TINY_VOCAB, hub_config_file, hub_id

    if opts.model is None:
        return {**TINY_DEFAULTS, "vocab_size": TINY_VOCAB}
    path = Path(opts.model) / "config.json"
    repo = hub_id(opts.model)
    if repo is not None:
        try:
            path = hub_config_file(repo, download=False)
        except UserError:  # not in the cache: the model check says so, once
            return None
        if path is None:
            return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def model_shape(opts: TrainOptions) -> LlamaShape:
    """The LlamaShape of --model (or of the embedded default), from its config only: no weights are read. From
    config.json as it is, in a fraction of a second; a config that leaves a size to its class's defaults (or names
    code of its own) through transformers' AutoConfig."""
    from zero_kit.plan.shapes import shape_from_hf_config

    config = None if opts.trust_remote_code else model_config_dict(opts)
    if config is not None:
        try:
            return shape_from_hf_config(config)
        except (KeyError, TypeError):
            pass
    from zero_kit.model import build_config

    return shape_from_hf_config(build_config(opts.model, trust_remote_code=opts.trust_remote_code).to_dict())


def workload_of(opts: TrainOptions, precision: str, shape: LlamaShape | None = None, *,
                precomputed: bool | None = None) -> Workload:  # fmt: skip
    """What the run trains, as the planner's Workload (`shape`: the model's, when it was read already;
    `precomputed`: DPO's reference log-probabilities, once decided: RunPlan.dpo_precompute)."""
    shape = shape or model_shape(opts)
    return Workload(
        shape=shape,
        n_params=shape.n_params,
        seq_len=opts.max_length,
        micro_batch=opts.micro_batch,
        precision=precision,
        lora_r=opts.lora_r,
        activation_checkpointing=opts.activation_checkpointing,
        preference=opts.method == "dpo",  # two sequences per pair and the reference: the memory check counts them
        # auto is decided once the pairs are counted: until then the reference is charged
        reference_precomputed=opts.method == "dpo" and (precomputed or opts.dpo_reference == "precompute"),
        sp=opts.sp,
        packed=opts.pack,
        tiled=opts.tiled_compute,
    )


def _offload_devices(ds_config: dict) -> dict[str, tuple[str, str | None]]:
    zero = ds_config.get("zero_optimization") or {}
    found = {}
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key) if isinstance(zero, dict) else None
        if isinstance(section, dict) and section.get("device") not in (None, "none"):
            found[key] = (str(section["device"]), section.get("nvme_path"))
    return found


def planner_view(ds_config: dict, workload: Workload, stage: int, ranks_per_node: int, nodes: int) -> PlannerView:
    """The run's ZeRO `stage` and the DeepSpeed dict's CPU offload in the planner's words, on `nodes` of
    `ranks_per_node` ranks."""
    devices = {key: device for key, (device, _) in _offload_devices(ds_config).items()}
    offload = "none"
    if devices.get("offload_optimizer") == "cpu":
        both = devices.get("offload_param") == "cpu" and stage == 3  # parameters offload only under ZeRO-3
        offload = "optimizer+param" if both else "optimizer"
    return PlannerView(workload, f"zero{stage}", offload, ranks_per_node, nodes)


def nvme_dirs(ds_config: dict, from_file: bool) -> tuple[tuple[str, str], ...]:
    """Each NVMe offload's directory and where it was set. A missing path never gets here: the generator refuses
    nvme without --nvme-path and the linter a file without nvme_path (lint/rules_zero.py), both as errors."""
    dirs = []
    for key, (device, path) in _offload_devices(ds_config).items():
        if device == "nvme" and path:
            dirs.append((f"zero_optimization.{key}.nvme_path" if from_file else "--nvme-path", str(path)))
    return tuple(dirs)

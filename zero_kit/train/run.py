"""One `zero-kit train` run, resolved once before any I/O: where this rank runs (from `zero_kit.dist`), the
precision, the world and node sizes, the DeepSpeed dict (generated, or read from --ds-config and linted), the
planner's view of it, the learning rate and the batch. TrainingArguments, preflight, the callbacks and the run
record read the `ResolvedRun`; nothing decodes a decision back out of another object.

    run = resolve_run(opts)               # this rank's machine from the launcher's environment
    run = resolve_run(opts, Machine(...)) # a given machine: what the unit tests do, without a process group
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zero_kit.dist import device_and_backend, local_world_size, world_size_from_env
from zero_kit.errors import UserError
from zero_kit.plan.assumptions import Assumptions
from zero_kit.plan.shapes import LlamaShape
from zero_kit.plan.workload import Workload
from zero_kit.train.options import TrainOptions, default_lr
from zero_kit.train.trainer_config import trainer_ds_config


@dataclass(frozen=True)
class Machine:
    """Where this rank runs, as the launcher and `zero_kit.dist` report it."""

    device: str
    """"cuda:N" (this rank's GPU) or "cpu"."""
    backend: str
    """The process-group backend: "nccl" on a GPU, "gloo" on the CPU."""
    rank: int
    """This rank's number in the job (RANK): rank 0 writes the run record and prints."""
    world_size: int
    """Ranks in the job, all nodes together."""
    local_size: int
    """Ranks on this node (the launcher's LOCAL_WORLD_SIZE / LOCAL_SIZE; else every rank is on this host)."""
    bf16_supported: bool
    """The GPU computes in bf16 (Ampere or newer): what `--precision auto` picks there."""

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(self.local_size, 1))


def detect_machine() -> Machine:
    """This rank's machine: device and backend from `zero_kit.dist` (which also selects the rank's GPU), the
    sizes from the launcher's environment (a process started without one was given a world of one)."""
    import torch

    device, backend = device_and_backend()
    try:
        world_size = world_size_from_env(dict(os.environ))[0] or 1
    except ValueError as err:
        raise UserError(
            f"the launcher's environment: {err}", "start the ranks with deepspeed, torchrun or srun"
        ) from None
    return Machine(
        device=device,
        backend=backend,
        rank=int(os.environ.get("RANK", "0")),
        world_size=world_size,
        local_size=local_world_size(world_size),
        bf16_supported=device != "cpu" and torch.cuda.is_bf16_supported(),
    )


@dataclass(frozen=True)
class PlannerView:
    """The run in the planner's words (zero_kit.plan), as preflight's host-RAM estimate needs it."""

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
class ResolvedRun:
    options: TrainOptions
    """The flags, with the concrete numbers (and enabled precision) of a --ds-config file in place of flags left at
    their defaults: read once from the file, never from a generated dict. What the run record keeps."""
    machine: Machine
    precision: str
    """"bf16", "fp16" or "fp32": what TrainingArguments, preflight and the MFU figure use."""
    ds_config: dict[str, Any]
    from_file: bool
    """The DeepSpeed dict came from --ds-config (linted) rather than the generator."""
    zero_stage: int
    learning_rate: float
    planner: PlannerView
    nvme_dirs: tuple[tuple[str, str], ...]
    """(where it was set: --nvme-path or the file's key path, directory) of each NVMe offload."""

    @property
    def output(self) -> Path:
        return Path(self.options.output)

    @property
    def micro_batch(self) -> int:
        return self.options.micro_batch

    @property
    def grad_accum(self) -> int:
        return self.options.grad_accum


def resolve_run(opts: TrainOptions, machine: Machine | None = None) -> ResolvedRun:
    """Every decision of a run in one object. `opts` has passed `check_options`; `machine`: this rank's
    (`detect_machine()`) unless given. Raises UserError for a config or flags this run cannot use."""
    machine = machine or detect_machine()
    device = "cuda" if machine.on_gpu else "cpu"
    work = workload_of(opts, "fp32")  # the shape only: precision changes no width
    ds_config = trainer_ds_config(opts, torch_adam=not machine.on_gpu, device=device, hidden_size=work.shape.hidden_size,
                                  trainable=work.trainable_params or work.n_params)  # fmt: skip
    from_file = opts.ds_config is not None
    options = adopt_file_values(opts, ds_config) if from_file else opts
    file_decided = options.precision != opts.precision  # --precision auto, and the file enables bf16 or fp16
    precision = resolve_precision(options.precision, machine, from_file_path=opts.ds_config if file_decided else None)
    stage = _zero_stage(ds_config)
    return ResolvedRun(
        options=options,
        machine=machine,
        precision=precision,
        ds_config=ds_config,
        from_file=from_file,
        zero_stage=stage,
        learning_rate=default_lr(options),
        planner=planner_view(ds_config, workload_of(options, precision, work.shape), machine),
        nvme_dirs=nvme_dirs(ds_config, from_file),
    )


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


def resolve_precision(choice: str, machine: Machine, *, from_file_path: str | None = None) -> str:
    """auto: bf16 on a GPU that supports it, else fp16 on a GPU, fp32 on the CPU. bf16/fp16 need a GPU.
    `from_file_path`: the choice came from that --ds-config file (its message names the file, not the flag)."""
    if choice == "auto":
        if not machine.on_gpu:
            return "fp32"
        return "bf16" if machine.bf16_supported else "fp16"
    if choice in ("bf16", "fp16") and not machine.on_gpu:
        if from_file_path is not None:
            raise UserError(
                f"--ds-config {from_file_path} enables {choice}, which needs a GPU; this host has none",
                f'set {choice}.enabled to false (or "auto") in the file to train in fp32 on CPU',
            )
        raise UserError(
            f"--precision {choice} needs a GPU; this host has none", "use --precision fp32 (or auto) on CPU"
        )
    return choice


def _zero_stage(ds_config: dict) -> int:
    zero = ds_config.get("zero_optimization")
    return int(zero.get("stage", 0)) if isinstance(zero, dict) else 0


def model_shape(model_dir: str | None, trust_remote_code: bool = False):
    """The LlamaShape of --model (or of the embedded default), from its config only: no weights are read."""
    from zero_kit.model import build_config
    from zero_kit.plan.shapes import shape_from_hf_config

    return shape_from_hf_config(build_config(model_dir, trust_remote_code=trust_remote_code).to_dict())


def workload_of(opts: TrainOptions, precision: str, shape: LlamaShape | None = None) -> Workload:
    """What the run trains, as the planner's Workload (`shape`: the model's, when it was read already)."""
    shape = shape or model_shape(opts.model, opts.trust_remote_code)
    return Workload(
        shape=shape,
        n_params=shape.n_params,
        seq_len=opts.max_length,
        micro_batch=opts.micro_batch,
        precision=precision,
        lora_r=opts.lora_r,
        activation_checkpointing=opts.activation_checkpointing,
    )


def _offload_devices(ds_config: dict) -> dict[str, tuple[str, str | None]]:
    zero = ds_config.get("zero_optimization") or {}
    found = {}
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key) if isinstance(zero, dict) else None
        if isinstance(section, dict) and section.get("device") not in (None, "none"):
            found[key] = (str(section["device"]), section.get("nvme_path"))
    return found


def planner_view(ds_config: dict, workload: Workload, machine: Machine) -> PlannerView:
    """The DeepSpeed dict's stage and CPU offload in the planner's words, on this machine's ranks and nodes."""
    devices = {key: device for key, (device, _) in _offload_devices(ds_config).items()}
    stage = _zero_stage(ds_config)
    offload = "none"
    if devices.get("offload_optimizer") == "cpu":
        both = devices.get("offload_param") == "cpu" and stage == 3  # parameters offload only under ZeRO-3
        offload = "optimizer+param" if both else "optimizer"
    return PlannerView(workload, f"zero{stage}", offload, machine.local_size, machine.nodes)


def nvme_dirs(ds_config: dict, from_file: bool) -> tuple[tuple[str, str], ...]:
    """Each NVMe offload's directory and where it was set. A missing path never gets here: the generator refuses
    nvme without --nvme-path and the linter a file without nvme_path (lint/rules_zero.py), both as errors."""
    dirs = []
    for key, (device, path) in _offload_devices(ds_config).items():
        if device == "nvme" and path:
            dirs.append((f"zero_optimization.{key}.nvme_path" if from_file else "--nvme-path", str(path)))
    return tuple(dirs)

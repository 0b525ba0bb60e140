"""Resource checks before `zero-kit train` spends time loading a model: a clear UserError naming the path or
option, the numbers and the fix, instead of a traceback minutes later in the middle of a save.

Checked, all problems collected and reported at once:
- the output directory can be created and written (a file in its place, a read-only mount, no permission);
- its filesystem has room for one more checkpoint: the shared byte tables (zero_kit.plan.accounting) give the
  parameters plus fp32 master and Adam moments DeepSpeed writes, summed over ranks (sharding splits the
  bytes over files, it does not remove them);
- an NVMe offload path exists, is a directory and is writable;
- host RAM holds the chosen CPU offload: the planner's per-node host model (zero_kit.plan.memory.host_terms)
  against psutil's total RAM. ZERO_KIT_HOST_MEM_BYTES overrides the RAM figure (what-if runs, tests).
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zero_kit.dist import local_world_size
from zero_kit.errors import UserError, raise_all

HOST_MEM_ENV = "ZERO_KIT_HOST_MEM_BYTES"
GIB = 2**30


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _write_probe(directory: Path) -> OSError | None:
    """Create and delete a file: the only test that also catches read-only mounts and root-squashed NFS."""
    probe = directory / f".zero_kit_probe_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as err:
        return err
    return None


def check_writable_dir(path: Path, flag: str, *, create: bool) -> list[UserError]:
    """`path` is (or can become) a writable directory; `flag` names the option in the message."""
    if path.exists() and not path.is_dir():
        return [UserError(f"{flag} {path}: exists and is not a directory", f"remove the file or choose another {flag}")]
    if not path.exists() and not create:
        return [UserError(f"{flag} {path}: does not exist", f"create it (mkdir -p {path}) or choose another {flag}")]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocker = _existing_ancestor(path)
        return [
            UserError(f"{flag} {path}: cannot create it ({err.strerror} at {blocker})", f"choose a writable {flag}")
        ]
    err = _write_probe(path)
    if err is not None:
        return [
            UserError(
                f"{flag} {path}: not writable ({err.strerror})", f"choose a writable {flag} or fix its permissions"
            )
        ]
    return []


def check_free_space(path: Path, need_bytes: int, what: str, flag: str) -> list[UserError]:
    free = shutil.disk_usage(_existing_ancestor(path)).free
    if free >= need_bytes:
        return []
    return [
        UserError(
            f"{flag} {path}: {_gib(free)} free on its filesystem, a checkpoint needs about {_gib(need_bytes)} ({what})",
            f"free {_gib(need_bytes - free)} or more there, or choose an {flag} on a larger disk",
        )
    ]


def checkpoint_bytes(n_params: int, precision: str, trainable_params: int | None = None) -> tuple[int, str]:
    """Bytes of one DeepSpeed checkpoint, all ranks together: weights + fp32 master + Adam moments."""
    from zero_kit.plan.accounting import model_state_bytes

    # At world size 1 the per-rank figures are the totals every sharded checkpoint also adds up to.
    states = model_state_bytes("zero2", n_params, 1, precision, trainable_params=trainable_params)
    params_formula, _, optimizer_formula = states.part_formulas
    return states.params + states.optimizer, f"{params_formula} + {optimizer_formula}, Ψ = {n_params:,}"


def _offload_devices(ds_config: dict) -> dict[str, tuple[str, str | None]]:
    zero = ds_config.get("zero_optimization") or {}
    found = {}
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key) if isinstance(zero, dict) else None
        if isinstance(section, dict) and section.get("device") not in (None, "none"):
            found[key] = (str(section["device"]), section.get("nvme_path"))
    return found


def check_nvme(ds_config: dict, from_file: bool) -> list[UserError]:
    problems = []
    for key, (device, nvme_path) in _offload_devices(ds_config).items():
        if device != "nvme":
            continue
        flag = f"zero_optimization.{key}.nvme_path" if from_file else "--nvme-path"
        if not nvme_path or nvme_path == "auto":
            problems.append(
                UserError(f"{flag}: NVMe offload ({key}) needs a directory", f"set {flag} to a local NVMe dir")
            )
            continue
        problems += check_writable_dir(Path(nvme_path), flag, create=False)
    return problems


def host_mem_bytes() -> int:
    override = os.environ.get(HOST_MEM_ENV)
    if override:
        try:
            return int(override)
        except ValueError:
            raise UserError(f"{HOST_MEM_ENV}={override!r} is not a number of bytes", f"unset {HOST_MEM_ENV}") from None
    import psutil

    return psutil.virtual_memory().total


def _plan_offload(ds_config: dict) -> str | None:
    devices = {key: device for key, (device, _) in _offload_devices(ds_config).items()}
    if devices.get("offload_optimizer") != "cpu":
        return None  # NVMe offload keeps states on disk; no CPU offload, nothing extra in RAM
    return "optimizer+param" if devices.get("offload_param") == "cpu" else "optimizer"


def check_host_ram(
    ds_config: dict, *, shape, precision: str, local_ranks: int, nodes: int, lora_r: int | None
) -> list[UserError]:
    """The planner's host RAM per node for this offload against the RAM this host has."""
    offload = _plan_offload(ds_config)
    stage = (ds_config.get("zero_optimization") or {}).get("stage", 0)
    if offload is None or stage not in (1, 2, 3):
        return []
    from zero_kit.plan.memory import HOST_BASELINE_PER_RANK, Workload, state_terms

    strategy = f"zero{stage}"
    if offload == "optimizer+param" and strategy != "zero3":
        offload = "optimizer"
    work = Workload(shape=shape, n_params=shape.n_params, precision=precision, lora_r=lora_r)
    _, offloaded, _ = state_terms(strategy, offload, work, local_ranks * nodes)
    # The planner's host model (zero_kit.plan.memory.host_terms) less its loading phase, whose fixed 5 GiB shard
    # would refuse tiny models: what the offload itself holds, pinned, plus each rank's baseline.
    ((states, formula),) = offloaded.values()
    terms = {
        "baseline per rank": (local_ranks * HOST_BASELINE_PER_RANK, f"{local_ranks} x 2 GiB"),
        "offloaded states, pinned": (local_ranks * states, f"{local_ranks} x ({formula})"),
    }
    need, have = sum(v for v, _ in terms.values()), host_mem_bytes()
    if need <= have:
        return []
    detail = "; ".join(f"{name} {_gib(value)} ({formula})" for name, (value, formula) in terms.items())
    return [
        UserError(
            f"offload_optimizer=cpu ({strategy}, {offload} offload): host RAM {_gib(have)} < about {_gib(need)} needed"
            f" per node by {local_ranks} rank(s) [{detail}]",
            "offload to nvme (--offload-optimizer nvme --nvme-path DIR), use fewer ranks per node, or a host with"
            " more RAM (`zero-kit plan --host-mem` shows what fits)",
        )
    ]


def model_shape(model_dir: str | None):
    """The LlamaShape of --model (or of the embedded default), from its config only: no weights are read."""
    from zero_kit.model import build_config
    from zero_kit.plan.shapes import shape_from_hf_config

    return shape_from_hf_config(build_config(model_dir).to_dict())


def run_preflight(
    ds_config: dict,
    *,
    model: str | None,
    output: Path,
    lora_r: int | None,
    from_file: bool,
    precision: str,
    local_ranks: int,
    nodes: int,
) -> None:
    """All checks for a `zero-kit train` run (`model`: --model, None for the embedded one; `from_file`: the config
    came from --ds-config); raises one UserError listing every problem."""
    shape = model_shape(model)
    trainable = None
    if lora_r is not None:
        from zero_kit.plan.memory import Workload

        trainable = Workload(shape=shape, n_params=shape.n_params, lora_r=lora_r).trainable_params
    need, formula = checkpoint_bytes(shape.n_params, precision, trainable)
    problems = check_writable_dir(output, "--output", create=True)
    if not problems:
        problems += check_free_space(output, need, formula, "--output")
    problems += check_nvme(ds_config, from_file=from_file)
    problems += check_host_ram(
        ds_config, shape=shape, precision=precision, local_ranks=local_ranks, nodes=nodes, lora_r=lora_r
    )
    raise_all(problems, "before training")


_DISK_ERRORS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded", errno.EROFS: "read-only"}
# What libraries that wrap the OS error say instead (safetensors' SafetensorError, torch's RuntimeError).
_DISK_MESSAGES = {
    "No space left on device": "the disk is full",
    "Disk quota exceeded": "the disk quota is exceeded",
    "Read-only file system": "read-only",
}


def _disk_reason(err: BaseException, output: Path) -> str | None:
    for exc in (err, err.__cause__, err.__context__):
        if isinstance(exc, OSError) and exc.errno in _DISK_ERRORS:
            return _DISK_ERRORS[exc.errno]
        text = str(exc) if exc is not None else ""
        for needle, reason in _DISK_MESSAGES.items():
            if needle in text:
                return reason
    # torch.save only says its zip writer failed; the free space on --output tells why.
    if "file write failed" in str(err) and shutil.disk_usage(_existing_ancestor(output)).free < 2**20:
        return "the disk is full"
    return None


@contextmanager
def disk_errors_as_user_errors(output: Path) -> Iterator[None]:
    """A disk that fills up (or turns read-only) during training: a UserError naming the directory, not a
    traceback. The checkpoint being written stays incomplete, so `--resume auto` skips it."""
    try:
        yield
    except Exception as err:
        reason = _disk_reason(err, output)
        if reason is None:
            raise
        free = shutil.disk_usage(_existing_ancestor(output)).free
        raise UserError(
            f"--output {output}: writing a checkpoint failed, {reason} ({_gib(free)} free): {str(err)[:200]}",
            "free space (or fix the mount) and relaunch with --resume auto: it continues from the last complete"
            " checkpoint",
        ) from err


def check_training_run(ds_config: dict, args, **run) -> None:
    """`run_preflight` for one rank of `zero-kit train` (args: its HF TrainingArguments; `run`: model, output,
    lora_r, from_file): precision from the arguments, ranks per node from the launcher's LOCAL_WORLD_SIZE (else
    all ranks on this host)."""
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    local_ranks = local_world_size(args.world_size)
    nodes = max(1, args.world_size // max(local_ranks, 1))
    run_preflight(ds_config, precision=precision, local_ranks=local_ranks, nodes=nodes, **run)

"""Resource checks before `zero-kit train` spends time loading a model: a clear UserError naming the path or
option, the numbers and the fix, instead of a traceback minutes later in the middle of a save.

Checked, all problems collected and reported at once:
- the output directory can be created and written (a file in its place, a read-only mount, no permission);
- its filesystem has room for one more checkpoint: the shared byte tables (zero_kit.plan.accounting) give the
  parameters plus fp32 master and Adam moments DeepSpeed writes, summed over ranks (sharding splits the
  bytes over files, it does not remove them);
- an NVMe offload path exists, is a directory and is writable (a missing path is the generator's and the
  linter's to refuse, before this runs);
- host RAM holds the chosen CPU offload: the planner's per-node host model (zero_kit.plan.memory.host_terms)
  with the planner's stated Assumptions (the run's; `zero-kit train` has no --assume, so the defaults) against
  psutil's total RAM. ZERO_KIT_HOST_MEM_BYTES overrides the RAM figure (what-if runs, tests).

Everything else about the run was decided before, once, in `zero_kit.train.plan.RunPlan`: this module only
asks the filesystem and the machine.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from zero_kit.errors import UserError, existing_ancestor, raise_all, write_probe
from zero_kit.metrics import GIB, gib

if TYPE_CHECKING:
    from zero_kit.train.plan import PlannerView

HOST_MEM_ENV = "ZERO_KIT_HOST_MEM_BYTES"


def check_writable_dir(path: Path, flag: str, *, create: bool) -> list[UserError]:
    """`path` is (or can become) a writable directory; `flag` names the option in the message."""
    if path.exists() and not path.is_dir():
        return [UserError(f"{flag} {path}: exists and is not a directory", f"remove the file or choose another {flag}")]
    if not path.exists() and not create:
        return [UserError(f"{flag} {path}: does not exist", f"create it (mkdir -p {path}) or choose another {flag}")]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocker = existing_ancestor(path)
        return [
            UserError(f"{flag} {path}: cannot create it ({err.strerror} at {blocker})", f"choose a writable {flag}")
        ]
    err = write_probe(path)
    if err is not None:
        return [
            UserError(
                f"{flag} {path}: not writable ({err.strerror})", f"choose a writable {flag} or fix its permissions"
            )
        ]
    return []


def check_free_space(path: Path, need_bytes: int, what: str, flag: str) -> list[UserError]:
    free = shutil.disk_usage(existing_ancestor(path)).free
    if free >= need_bytes:
        return []
    return [
        UserError(
            f"{flag} {path}: {gib(free, 2)} free on its filesystem, a checkpoint needs about {gib(need_bytes, 2)} ({what})",
            f"free {gib(need_bytes - free, 2)} or more there, or choose an {flag} on a larger disk",
        )
    ]


def checkpoint_bytes(n_params: int, precision: str, trainable_params: int | None = None) -> tuple[int, str]:
    """Bytes of one DeepSpeed checkpoint, all ranks together: weights + fp32 master + Adam moments."""
    from zero_kit.plan.accounting import model_state_bytes

    # At world size 1 the per-rank figures are the totals every sharded checkpoint also adds up to.
    states = model_state_bytes("zero2", n_params, 1, precision, trainable_params=trainable_params)
    params_formula, _, optimizer_formula = states.part_formulas
    return states.params + states.optimizer, f"{params_formula} + {optimizer_formula}, Ψ = {n_params:,}"


def check_nvme(nvme_dirs: tuple[tuple[str, str], ...]) -> list[UserError]:
    """Each NVMe offload directory (`(flag or key path, directory)` pairs) exists and is writable."""
    problems = []
    for flag, path in nvme_dirs:
        problems += check_writable_dir(Path(path), flag, create=False)
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


def check_host_ram(view: PlannerView) -> list[UserError]:
    """The planner's host RAM per node for this run's CPU offload against the RAM this host has."""
    if view.offload == "none" or view.strategy not in ("zero1", "zero2", "zero3"):
        return []
    from zero_kit.plan.memory import state_terms

    ranks = view.ranks_per_node
    _, offloaded, _ = state_terms(view.strategy, view.offload, view.workload, ranks * view.nodes)
    # The planner's host model (zero_kit.plan.memory.host_terms) less its loading phase, whose fixed 5 GiB shard
    # would refuse tiny models: what the offload itself holds, pinned, plus each rank's baseline.
    ((states, formula),) = offloaded.values()
    baseline = view.assume.host_baseline_bytes
    terms = {
        "baseline per rank": (ranks * baseline, f"{ranks} x {baseline / GIB:g} GiB"),
        "offloaded states, pinned": (ranks * states, f"{ranks} x ({formula})"),
    }
    need, have = sum(v for v, _ in terms.values()), host_mem_bytes()
    if need <= have:
        return []
    detail = "; ".join(f"{name} {gib(value, 2)} ({formula})" for name, (value, formula) in terms.items())
    return [
        UserError(
            f"offload_optimizer=cpu ({view.strategy}, {view.offload} offload): host RAM {gib(have, 2)} < about"
            f" {gib(need, 2)} needed per node by {ranks} rank(s) [{detail}]",
            "offload to nvme (--offload-optimizer nvme --nvme-path DIR), use fewer ranks per node, or a host with"
            " more RAM (`zero-kit plan --host-mem` shows what fits)",
        )
    ]


def run_preflight(output: Path, view: PlannerView, nvme_dirs: tuple[tuple[str, str], ...] = ()) -> None:
    """All checks for a `zero-kit train` run writing to `output` (--output), whose model, precision, offload and
    ranks `view` gives; raises one UserError listing every problem."""
    work = view.workload
    need, formula = checkpoint_bytes(work.n_params, work.precision, work.trainable_params)
    problems = check_writable_dir(output, "--output", create=True)
    if not problems:
        problems += check_free_space(output, need, formula, "--output")
    problems += check_nvme(nvme_dirs)
    problems += check_host_ram(view)
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
    if "file write failed" in str(err) and shutil.disk_usage(existing_ancestor(output)).free < 2**20:
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
        free = shutil.disk_usage(existing_ancestor(output)).free
        raise UserError(
            f"--output {output}: writing a checkpoint failed, {reason} ({gib(free, 2)} free): {str(err)[:200]}",
            "free space (or fix the mount) and relaunch with --resume auto: it continues from the last complete"
            " checkpoint",
        ) from err

"""Resource checks before `zero-kit train` spends time loading a model: a clear UserError naming the path or
option, the numbers and the fix, instead of a traceback minutes later in the middle of a save.

Checked, all problems collected and reported at once:
- the output directory can be created and written (a file in its place, a read-only mount, no permission);
- its filesystem has room for the checkpoints the run holds at once (the newest --save-total-limit plus the one
  being written, less those already there: checkpoints_at_once), each the parameters plus fp32 master and Adam
  moments DeepSpeed writes by the shared byte tables (zero_kit.plan.accounting), summed over ranks (sharding
  splits the bytes over files, it does not remove them);
- an NVMe offload path exists, is a directory and is writable (a missing path is the generator's and the
  linter's to refuse, before this runs);
- host RAM holds the chosen CPU offload: the planner's per-node host model (zero_kit.plan.memory.host_terms)
  with the planner's stated Assumptions (the run's; `zero-kit train` has no --assume, so the defaults) against
  psutil's total RAM. ZERO_KIT_HOST_MEM_BYTES overrides the RAM figure (what-if runs, tests).

A disk that fills up anyway (another job's files) while the run writes: one line from rank 0 naming the free space
and the checkpoint that is intact, exit EXIT_DISK_FULL (disk_full_error).

Everything else about the run was decided before, once, in `zero_kit.train.plan.RunPlan`: this module only
asks the filesystem and the machine.
"""

from __future__ import annotations

import errno
import math
import os
import shutil
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


def check_free_space(path: Path, need_bytes: int, what: str, flag: str, checkpoints: int = 1) -> list[UserError]:
    """Room on `path`'s filesystem for `checkpoints` more checkpoints of `need_bytes` each (see checkpoints_at_once)."""
    free = shutil.disk_usage(existing_ancestor(path)).free
    total = need_bytes * checkpoints
    if free >= total:
        return []
    if checkpoints == 1:
        needed, lower = f"a checkpoint needs about {gib(need_bytes, 2)} ({what})", ""
    else:
        needed = (f"{checkpoints} more checkpoints at once need about {gib(total, 2)} (the newest --save-total-limit "
                  f"kept plus the one being written; {gib(need_bytes, 2)} each: {what})")  # fmt: skip
        lower = ", lower --save-total-limit (1 keeps 2 at once) or save only at the end (no --save-steps)"
    return [
        UserError(
            f"{flag} {path}: {gib(free, 2)} free on its filesystem, {needed}",
            f"free {gib(total - free, 2)} or more there{lower}, or choose an {flag} on a larger disk",
        )
    ]


def checkpoints_at_once(keep: int | None, saves: int | None, existing: int) -> int:
    """How many more checkpoints than today's a run holds on disk at its fullest. A new one is written while the
    newest `keep` (--save-total-limit; None: all) stay, and older ones go only once it is complete: up to keep + 1,
    never more than the run's `saves` (None: not known ahead, an --epochs run with --save-steps). The `existing`
    complete checkpoints count among the kept (with --resume never they are deleted first and free as much). At
    least one: the run's final save."""
    if keep is None and saves is None:  # every save kept, how many unknown: only the first can be asked for
        return 1
    room = math.inf if keep is None else keep - existing
    later = math.inf if saves is None else saves - 1
    return max(1, int(min(room, later)) + 1)


def planned_saves(max_steps: int | None, save_steps: int | None) -> int | None:
    """Checkpoints a run writes: one every --save-steps and one at the end; None where --max-steps is not given."""
    if not save_steps:
        return 1
    return None if max_steps is None else max_steps // save_steps + (1 if max_steps % save_steps else 0)


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


def run_preflight(output: Path, view: PlannerView, nvme_dirs: tuple[tuple[str, str], ...] = (),
                  checkpoints: int = 1) -> None:  # fmt: skip
    """All checks for a `zero-kit train` run writing to `output` (--output), whose model, precision, offload and
    ranks `view` gives, and that holds up to `checkpoints` more checkpoints at once (checkpoints_at_once); raises
    one UserError listing every problem."""
    problems = check_writable_dir(output, "--output", create=True)
    if not problems:
        problems += check_output_space(output, view, checkpoints)
    problems += check_nvme(nvme_dirs)
    problems += check_host_ram(view)
    raise_all(problems, "before training")


def check_output_space(output: Path, view: PlannerView, checkpoints: int) -> list[UserError]:
    """Room on --output for the checkpoints the run holds at once (the starting process asks before the data is
    prepared; each rank again before the model)."""
    need, formula = run_checkpoint_bytes(view)
    return check_free_space(output, need, formula, "--output", checkpoints)


def run_checkpoint_bytes(view: PlannerView) -> tuple[int, str]:
    """checkpoint_bytes of the run `view` plans."""
    work = view.workload
    return checkpoint_bytes(work.n_params, work.precision, work.trainable_params)


def refuse_no_room(output: Path, view: PlannerView, opts) -> None:
    """check_output_space for a run of `opts` (TrainOptions), raised: the starting process asks it before the data
    is prepared, so a disk too small is said in the command's first seconds, not by every rank."""
    raise_all(check_output_space(output, view, run_checkpoints(opts, output)), "on --output")


def run_checkpoints(opts, output: Path) -> int:
    """checkpoints_at_once for a run of `opts` (TrainOptions) writing into `output`."""
    from zero_kit.checkpoints import store

    existing = sum(1 for path in store.list_checkpoints(output) if store.is_complete(path))
    return checkpoints_at_once(opts.save_total_limit, planned_saves(opts.max_steps, opts.save_steps), existing)


_READ_ONLY = "the filesystem is read-only"
_DISK_ERRORS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded", errno.EROFS: _READ_ONLY}
# What libraries that wrap the OS error say instead (safetensors' SafetensorError, torch's RuntimeError).
_DISK_MESSAGES = {
    "No space left on device": "the disk is full",
    "Disk quota exceeded": "the disk quota is exceeded",
    "Read-only file system": _READ_ONLY,
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


EXIT_DISK_FULL = 74
"""Exit code of a run that a full disk (or quota, or a read-only mount) ended while it wrote to --output: EX_IOERR
from sysexits.h. The checkpoint being written stays incomplete, so `--resume auto` continues from the one before."""


def disk_full_error(err: BaseException, output: Path, one: int, step: int) -> tuple[UserError, bool] | None:
    """A run ended by the disk while it wrote to `output` at `step`, as its one line and whether every rank can
    tell (the disk cannot hold a checkpoint while checkpoint-STEP is incomplete: a rank whose peer left in the
    save then sees only a failed collective, a RuntimeError, and knows it is this), or None when `err` is another
    failure. `one`: the bytes of one checkpoint (checkpoint_bytes)."""
    from zero_kit.checkpoints import store

    free = shutil.disk_usage(existing_ancestor(output)).free
    saving = output / f"checkpoint-{step}"
    saving_cut = saving.is_dir() and not store.is_complete(saving)
    plain = (free < one and saving_cut) or free < 2**20
    reason = _disk_reason(err, output) or ("the disk is full" if plain and isinstance(err, RuntimeError) else None)
    if reason is None:
        return None
    intact = store.newest_complete(output)
    writing = saving.name if saving_cut else "to it"
    kept = f"{intact.name} is complete and intact" if intact is not None else "no checkpoint is complete yet"
    then = f"--resume auto continues from {intact.name}" if intact is not None else "it starts over"
    more = f"free {gib(one - free, 2)} or more there" if one > free else "free space there (or raise the quota)"
    room = (
        "make it writable again"
        if reason == _READ_ONLY
        else f"{more} (a checkpoint needs about {gib(one, 2)}), or pass an --output on a larger disk"
    )
    message = f"--output {output}: {reason} ({gib(free, 2)} free) while writing {writing}; {kept}"
    return UserError(message, f"{room}; then run the same command again: {then}", exit_code=EXIT_DISK_FULL), plain

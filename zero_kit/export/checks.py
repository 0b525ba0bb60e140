"""What an export checks before any library is loaded or any shard read (zero_kit.export.to_hf): the checkpoint is a
complete zero-kit one, its model names no code of its own unless trusted, and the output directory is free to write
(empty, an earlier export's, or --force). A mistake there costs the user a second, not an import of DeepSpeed."""

from __future__ import annotations

from pathlib import Path

from zero_kit.checkpoints import store
from zero_kit.errors import UserError

EXPORT_MARK = ".zero_kit_export"
"""In every directory an export wrote: a later export may replace it without --force."""


def check_export(checkpoint_dir: Path, out_dir: Path, *, force: bool = False, trust_remote_code: bool = False) -> dict:
    """The cheap checks of an export, before any library is loaded or shard read: the checkpoint is a complete
    zero-kit one (its run record is returned), its --model names no code of its own unless trust_remote_code, and
    `out_dir` is empty, an earlier export's, or --force; then `out_dir` is created with the export's mark (the
    first write, so an unwritable path is said in the first second too)."""
    from zero_kit.model import check_trusted, resolve_model

    info = _run_info(Path(checkpoint_dir))
    # a record's Hub id (org/name): its snapshot in the Hugging Face cache, which the export reads like a directory
    info["options"]["model"] = resolve_model(info["options"].get("model"))
    check_trusted(info["options"].get("model"), trust_remote_code)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: a file is there, not a directory", "give a directory path to --out")
    owned = (out_dir / EXPORT_MARK).is_file()
    if out_dir.is_dir() and any(out_dir.iterdir()) and not owned and not force:
        raise UserError(
            f"--out {out_dir}: the directory is not empty and zero-kit did not write it",
            "give a new or empty directory, or add --force to write into it (files of the same names are replaced)",
        )
    _make_out_dir(out_dir)
    return info


def live_run_checkpoint(given: Path) -> tuple[Path, str] | None:
    """`zero-kit export OUTPUT` while a run still trains into OUTPUT (it holds the output's claim,
    zero_kit.checkpoints.claim): (its newest complete checkpoint, the line that says so). A checkpoint being written is
    never picked: it is complete only once its manifest is there. None: not an output a live run holds."""
    import time

    from zero_kit.checkpoints.claim import is_running

    if store.checkpoint_step(given) is not None or not given.is_dir():
        return None
    holder = is_running(given)
    if holder is None:
        return None
    running = f"the run in {given} is still going ({holder.describe(time.time())})"
    newest = store.newest_complete(given)
    if newest is None:
        raise UserError(f"{given}: {running} and has no complete checkpoint yet",
                        "export once it has saved one (every --save-steps, and at its end)")  # fmt: skip
    return newest, f"{running}: exporting {newest.name}, its newest complete checkpoint"


def check_still_complete(ckpt: Path) -> None:
    """After an export of a live run's checkpoint: the run's rotation (--save-total-limit) did not delete it
    meanwhile (what was read would be partly missing)."""
    if not store.is_complete(ckpt):
        raise UserError(f"{ckpt}: the running job rotated it away while it was exported",
                        f"export again: the newest complete checkpoint in {ckpt.parent} is taken")  # fmt: skip


def _make_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / EXPORT_MARK).write_text("written by zero-kit export\n", encoding="utf-8")
    except OSError as err:
        raise UserError(
            f"--out {out_dir}: cannot write there ({err.strerror or err})", "give a directory you can write to"
        ) from None


def _run_info(checkpoint_dir: Path) -> dict:
    if not store.is_complete(checkpoint_dir):
        problem, fix = _not_a_checkpoint(checkpoint_dir)
        raise UserError(f"{checkpoint_dir}: {problem}", fix)
    from zero_kit.lint import Unreadable, read_config

    path = checkpoint_dir / store.RUN_INFO
    try:
        info, duplicates = read_config(path)
    except Unreadable as err:
        raise UserError(
            f"{checkpoint_dir}: cannot read {err.where(store.RUN_INFO)} ({err})", "re-save the checkpoint"
        ) from None
    if duplicates:  # the record says how to rebuild the model: an ambiguous one must not pick silently
        lines = "\n".join("  " + str(p).replace("\n", "\n  ") for p in duplicates)
        raise UserError(f"{path} has {len(duplicates)} error(s):\n{lines}", "keep one entry of each key")
    return info


def _not_a_checkpoint(given: Path) -> tuple[str, str]:
    """What is wrong with `given` and a fix that is true on this disk: the complete checkpoint to export instead,
    or how to get one."""
    is_output = given.is_dir() and store.checkpoint_step(given) is None
    output = given if is_output else given.parent
    newest = store.newest_complete(output)
    if is_output:
        problem = "a training output, not a checkpoint" if newest else "holds no complete zero-kit checkpoint"
    elif given.is_dir():
        problem = f"incomplete checkpoint (no {store.MANIFEST} or files missing: a save cut short, or not zero-kit's)"
    else:
        problem = "no such checkpoint directory"
    if newest is not None:
        return problem, f"export {newest} (the newest complete checkpoint there)"
    return problem, (
        f"there is no complete checkpoint in {output}: train one with zero-kit train --output {output} "
        "(it saves at the end and every --save-steps)"
    )

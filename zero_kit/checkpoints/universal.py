"""Resume at a different world size through DeepSpeed's universal checkpoint.

A ZeRO checkpoint holds one optimizer shard per data-parallel rank, cut for the world size that wrote it;
DeepSpeed refuses to load it at another size. When `zero-kit train --resume` picks a checkpoint written at a
different world size (as its manifest / zero_kit_run.json records), rank 0 converts it once with DeepSpeed's
own tool (`python -m deepspeed.checkpoint.ds_to_universal`) into `checkpoint-N/global_stepN_universal` and
points `checkpoint-N/latest_universal` at it; every rank then loads it through the HF Trainer's usual
DeepSpeed resume (`engine.load_checkpoint`) with `"checkpoint": {"load_universal": true}` in the config.

The conversion is crash-safe like the checkpoints themselves: it is written under a temporary name, renamed,
and `latest_universal` is written last, atomically; a half-done conversion is deleted and redone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from zero_kit.checkpoints import store
from zero_kit.dist import any_rank
from zero_kit.errors import UserError
from zero_kit.log import say

LATEST_UNIVERSAL = "latest_universal"
FAILED_MARKER = ".universal_failed"
TIMEOUT_S = 3600


def saved_world_size(ckpt: Path) -> int | None:
    """The world size that wrote `ckpt`: from zero-kit's manifest or run record, else DeepSpeed's shard files."""
    for name in (store.MANIFEST, store.RUN_INFO):
        try:
            value = json.loads((ckpt / name).read_text(encoding="utf-8")).get("world_size")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and value > 0:
            return value
    tag = deepspeed_tag(ckpt)
    if tag is None:
        return None
    shards = list((ckpt / tag).glob("*_optim_states.pt"))
    return len(shards) or None


def deepspeed_tag(ckpt: Path) -> str | None:
    """The tag DeepSpeed's `latest` file names (e.g. global_step4), if it exists as a directory."""
    try:
        tag = (ckpt / "latest").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return tag if tag and (ckpt / tag).is_dir() else None


def universal_ready(ckpt: Path) -> bool:
    """True once our pointer names the finished, renamed conversion (never the temporary directory)."""
    try:
        tag = (ckpt / LATEST_UNIVERSAL).read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return tag == f"{deepspeed_tag(ckpt)}_universal" and (ckpt / tag / "zero").is_dir()


def convert(ckpt: Path) -> Path:
    """Write the universal form of `ckpt` (rank 0 only); returns its directory. Idempotent and crash-safe."""
    tag = deepspeed_tag(ckpt)
    if tag is None or not (ckpt / store.MANIFEST).is_file():
        raise UserError(
            f"{ckpt}: not a zero-kit checkpoint (no {store.MANIFEST}) with a DeepSpeed `latest` tag to convert",
            "resume from a checkpoint-N written by zero-kit train",
        )
    final = ckpt / f"{tag}_universal"
    if universal_ready(ckpt):
        return final
    tmp = ckpt / f".{tag}_universal.tmp"
    for leftover in (tmp, final):  # inside a checkpoint proven zero-kit's (its manifest, above): our own leftovers
        shutil.rmtree(leftover, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(ckpt / tag),
        "--output_folder",
        str(tmp),
        "--num_extract_workers",
        "1",  # in-process: no process pool inside a training rank
        "--num_merge_workers",
        "1",
        # ZeRO-1/2 checkpoints written through the HF Trainer lack the `universal_checkpoint_info` that only
        # Megatron-DeepSpeed writes, and the tool refuses them without this (DeepSpeed issues #5405, #5430, open in
        # 0.19.8). It adds only that missing version record; ZeRO-3 checkpoints take another path and ignore it.
        "--inject_missing_state",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)  # ours: the conversion's own temporary folder in our checkpoint
        (ckpt / LATEST_UNIVERSAL).unlink(missing_ok=True)
        raise UserError(
            f"{ckpt}: DeepSpeed's universal checkpoint conversion failed (exit {proc.returncode}):\n"
            + proc.stderr[-2000:],
            f"resume at the world size that wrote it ({saved_world_size(ckpt)} ranks)",
        )
    # ds_to_universal points a `latest_universal` beside its output folder at the temporary name: ours wins.
    (ckpt / LATEST_UNIVERSAL).unlink(missing_ok=True)
    os.replace(tmp, final)
    store.fsync_tree(final)
    store.atomic_write_text(ckpt / LATEST_UNIVERSAL, final.name + "\n")
    return final


def prepare_resume(resume_from: Path | None, args) -> bool:
    """Call on every rank after the resume checkpoint is chosen, before the Trainer is built (args: the HF
    TrainingArguments). If the checkpoint was written at another world size: rank 0 converts it, all ranks
    wait, and the DeepSpeed config gets `load_universal`. Returns True when the universal path is taken."""
    if resume_from is None:
        return False
    saved = saved_world_size(resume_from)
    if saved is None or saved == args.world_size:
        return False
    failure = None
    if args.process_index == 0:
        say(
            f"zero-kit train: {resume_from.name} was written by {saved} rank(s), this run has {args.world_size}:"
            " converting it to a DeepSpeed universal checkpoint"
        )
        (resume_from / FAILED_MARKER).unlink(missing_ok=True)
        try:
            convert(resume_from)
        except (UserError, OSError, subprocess.TimeoutExpired) as err:
            failure = err
            (resume_from / FAILED_MARKER).write_text(str(err)[:2000])
    else:
        _wait_for_rank0(resume_from)
    try:
        _agree_or_raise(failure, resume_from)
    finally:
        if args.process_index == 0:  # every rank is past its wait once the agreement returned
            (resume_from / FAILED_MARKER).unlink(missing_ok=True)
    config = args.hf_deepspeed_config.config
    config.setdefault("checkpoint", {})["load_universal"] = True
    return True


def _wait_for_rank0(ckpt: Path) -> None:
    """Other ranks wait on the shared filesystem, not in a collective: a long conversion of a big model must
    not trip --collective-timeout. A marker left by an earlier failed attempt is stale until rank 0 removes it,
    so the wait starts only once the conversion is visibly under way or done."""
    import time

    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if universal_ready(ckpt) or (ckpt / FAILED_MARKER).is_file():
            return
        time.sleep(1.0)


def _agree_or_raise(failure: Exception | None, ckpt: Path) -> None:
    """Every rank learns whether rank 0's conversion worked (no rank waits forever on a failed one)."""
    ok = not any_rank(failure is not None)
    if isinstance(failure, UserError):
        raise failure
    if not ok:
        raise UserError(f"{ckpt}: universal checkpoint conversion failed on rank 0 ({failure or 'see its log'})")

"""Crash-safe checkpoints on top of the HF Trainer's DeepSpeed checkpointing.

The Trainer writes `OUTPUT/checkpoint-N/` in place (model states, every rank's optimizer shards,
scheduler, per-rank RNG, trainer state). A kill in the middle of that leaves a directory that looks
like a checkpoint but is not one. So a checkpoint only counts once it is *complete*:

1. every rank fsyncs what it wrote, then all ranks meet at a barrier;
2. rank 0 writes `checkpoint-N/zero_kit_complete.json` (a manifest of every file with its size)
   through write-temp + fsync + rename, then moves `OUTPUT/latest_complete` the same way.

`--resume auto` only ever picks a directory whose manifest exists and whose files all have the sizes
recorded, so a kill at any moment of a save resumes from the previous complete checkpoint.

zero-kit deletes only what it wrote. Every rank writes `checkpoint-N/.zero_kit_partial` before the Trainer writes
into the directory (and rank 0 again before a rotation starts deleting one), so a directory is zero-kit's when it
holds the manifest or that mark. A `checkpoint-N` with neither (another tool's, e.g. an HF Trainer run's) is never
deleted, never resumed, and named in a warning (`foreign`). In a complete checkpoint, what zero-kit wrote is what its
manifest lists (and a universal conversion's files, `universal`): a rotation or `--resume never` that meets any other
file there removes zero-kit's files only and leaves the folder, said in one line (`Removal.kept`).

A checkpoint whose manifest is there but a listed file is missing or of another size is damaged, not cut short: it is
never deleted, never resumed, and a `--resume auto` that meets it as the newest refuses, naming the file and the
newest sound checkpoint (`damage`). Only a save cut short (no manifest, or the mark of a deletion under way) is
cleaned up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = "zero_kit_complete.json"
POINTER = "latest_complete"
RUN_INFO = "zero_kit_run.json"
PARTIAL_MARK = ".zero_kit_partial"
"""zero-kit is writing (or deleting) this checkpoint: it is ours, and not complete while the mark is there."""
DELETING_PREFIX = ".zero_kit_deleting-"
"""A checkpoint-N being deleted is renamed to DELETING_PREFIX + its name + a pid first."""
REMOVING = ".zero_kit_removing.json"
"""A checkpoint that holds files zero-kit did not write loses only zero-kit's: the manifest is renamed to this
record first (the checkpoint is no longer complete), the files it lists are removed, then the record."""
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` so that readers see either the old file or the whole new one, even after a power cut."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (data first, then the directory entries)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except FileNotFoundError:  # another rank's temp file, renamed meanwhile: its writer fsyncs it
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def checkpoint_step(path: Path) -> int | None:
    match = _CHECKPOINT_RE.match(path.name)
    return int(match.group(1)) if match else None


def _file_sizes(root: Path) -> dict[str, int]:
    sizes = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MANIFEST and not path.name.startswith("."):
            sizes[str(path.relative_to(root))] = path.stat().st_size
    return sizes


def write_manifest(checkpoint_dir: Path, *, step: int, world_size: int, eval_loss: float | None = None) -> None:
    """Rank 0, after the barrier that follows every rank's fsync: declare the checkpoint complete. `eval_loss`: that
    of this step's weights, when they were evaluated (--keep-best reads it back, `best_complete`)."""
    manifest = {"step": step, "world_size": world_size, "files": _file_sizes(checkpoint_dir)}
    if eval_loss is not None:
        manifest["eval_loss"] = eval_loss
    atomic_write_text(checkpoint_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    (checkpoint_dir / PARTIAL_MARK).unlink(missing_ok=True)  # the manifest now says "ours"; the mark is not listed
    atomic_write_text(checkpoint_dir.parent / POINTER, checkpoint_dir.name + "\n")


def mark_partial(checkpoint_dir: Path) -> None:
    """Before anything is written into (or deleted from) `checkpoint_dir`: claim it as zero-kit's, so a save cut
    short is cleaned up by the next run while another tool's `checkpoint-N` is left alone."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(checkpoint_dir / PARTIAL_MARK, "written by zero-kit train; a save or deletion under way\n")


def is_ours(checkpoint_dir: Path) -> bool:
    """zero-kit wrote this directory: it holds the manifest or the mark of a save (or deletion) in progress. An
    empty one, or one holding only the mark's temporary file (a kill between mkdir and the mark), holds no work."""
    if any((checkpoint_dir / name).is_file() for name in (MANIFEST, PARTIAL_MARK, REMOVING)):
        return True
    try:
        return all(path.name.startswith(f".{PARTIAL_MARK}.tmp") for path in checkpoint_dir.iterdir())
    except OSError:
        return False


def foreign(output_dir: Path) -> list[Path]:
    """`checkpoint-N` directories zero-kit did not write: never deleted, never resumed."""
    return [path for path in list_checkpoints(output_dir) if not is_ours(path)]


def _listed(checkpoint_dir: Path, record: str) -> list[str] | None:
    """The files a manifest (or a removal's record of it) lists; None when there is no readable one."""
    try:
        files = json.loads((checkpoint_dir / record).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return list(files) if isinstance(files, dict) else None


def _written_after(rel: str) -> bool:
    """zero-kit's own files that come after the manifest: a universal conversion (zero_kit.checkpoints.universal),
    and marks and temporary files (a leading dot)."""
    top = rel.split("/", 1)[0]
    return top == "latest_universal" or top.endswith("_universal") or any(p.startswith(".") for p in rel.split("/"))


def foreign_files(checkpoint_dir: Path) -> list[str]:
    """Files in a complete (or half-removed) checkpoint that zero-kit did not write: not in its manifest. A save cut
    short has no manifest: everything in it is the save's."""
    listed = _listed(checkpoint_dir, MANIFEST) or _listed(checkpoint_dir, REMOVING)
    if listed is None:
        return []
    known = {*listed, MANIFEST}
    found = (str(p.relative_to(checkpoint_dir)) for p in sorted(checkpoint_dir.rglob("*")) if p.is_file())
    return [rel for rel in found if rel not in known and not _written_after(rel)]


def _delete_ours(path: Path) -> bool:
    """Delete a checkpoint directory proven zero-kit's; False when it holds files zero-kit did not write, which stay
    with the folder (zero-kit's own files in it are removed). The mark goes in before the manifest goes out, then the
    directory is renamed to a name only zero-kit uses (atomic: no rank or later run ever sees a `checkpoint-N`
    half deleted, whose mark rmtree may already have removed) and removed; a removal cut short leaves that name,
    which the next `remove_incomplete` finishes."""
    if not is_ours(path):
        raise RuntimeError(f"refusing to delete {path}: zero-kit did not write it")
    if foreign_files(path):
        _remove_listed(path)
        return False
    mark_partial(path)
    (path / MANIFEST).unlink(missing_ok=True)
    doomed = path.with_name(f"{DELETING_PREFIX}{path.name}.{os.getpid()}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _remove_listed(path: Path) -> None:
    """Remove zero-kit's files from a checkpoint that holds others too: the manifest becomes the removal's record
    (atomic: from then on the checkpoint is not complete), the files it lists and zero-kit's own later files go,
    then empty folders and the record. A removal cut short is finished by the next `remove_incomplete`."""
    if (path / MANIFEST).is_file():
        os.replace(path / MANIFEST, path / REMOVING)
        fsync_dir(path)
    listed = set(_listed(path, REMOVING) or ())
    for file in sorted(path.rglob("*"), reverse=True):
        rel = str(file.relative_to(path))
        if file.is_file() and (rel in listed or rel == MANIFEST or (_written_after(rel) and rel != REMOVING)):
            file.unlink(missing_ok=True)
        elif file.is_dir() and not any(file.iterdir()):
            file.rmdir()
    (path / REMOVING).unlink(missing_ok=True)


def _remove_deletions_cut_short(output_dir: Path) -> None:
    """Directories `_delete_ours` renamed and did not finish removing (the name is zero-kit's own)."""
    for path in output_dir.glob(f"{DELETING_PREFIX}checkpoint-*"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def is_complete(checkpoint_dir: Path) -> bool:
    """True when the manifest exists and every file it lists is present with the recorded size."""
    try:
        manifest = json.loads((checkpoint_dir / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if (checkpoint_dir / PARTIAL_MARK).exists():  # a rotation began deleting it
        return False
    for rel, size in files.items():
        path = checkpoint_dir / rel
        if not path.is_file() or path.stat().st_size != size:
            return False
    return bool(files)


def list_checkpoints(output_dir: Path) -> list[Path]:
    """All `checkpoint-N` directories, oldest step first (complete or not)."""
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)


def newest_complete(output_dir: Path) -> Path | None:
    """The checkpoint to resume from: the pointer's target if complete, else the newest complete one."""
    pointer = output_dir / POINTER
    if pointer.is_file():
        target = output_dir / pointer.read_text(encoding="utf-8").strip()
        newer = [p for p in list_checkpoints(output_dir) if checkpoint_step(p) > (checkpoint_step(target) or -1)]
        if is_complete(target) and not any(is_complete(p) for p in newer):
            return target
    complete = [p for p in list_checkpoints(output_dir) if is_complete(p)]
    return complete[-1] if complete else None


def damage(checkpoint_dir: Path) -> str | None:
    """What is wrong with a checkpoint whose save completed (its manifest, no mark of a save or deletion under way):
    the first listed file missing or of another size. None: sound, or not a completed save."""
    if (checkpoint_dir / PARTIAL_MARK).exists():
        return None
    try:
        files = json.loads((checkpoint_dir / MANIFEST).read_text(encoding="utf-8"))["files"]
        listed = files.items()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    for rel, size in listed:
        path = checkpoint_dir / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != size:
            return f"{rel} has {path.stat().st_size} bytes, its manifest says {size}"
    return None


def damaged(output_dir: Path) -> list[tuple[Path, str]]:
    """The damaged checkpoints of `output_dir` (see `damage`), oldest first, each with what is wrong."""
    found = ((path, damage(path)) for path in list_checkpoints(output_dir))
    return [(path, what) for path, what in found if what is not None]


@dataclass
class Removal:
    """What a clean-up removed, and the folders it kept for files zero-kit did not write (or for damage)."""

    removed: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)

    def delete(self, path: Path) -> None:
        others = foreign_files(path)
        if _delete_ours(path):
            self.removed.append(path)
        else:
            more = f" and {len(others) - 3} more" if len(others) > 3 else ""
            self.kept.append((path, f"files zero-kit did not write: {', '.join(others[:3])}{more}"))

    def lines(self, why: str, output_dir: Path) -> list[str]:
        """`why` with the removed folders, and one line per folder kept."""
        names = ", ".join(path.name for path in self.removed)
        said = [f"{why} {names} from {output_dir}"] if self.removed else []
        return said + self.kept_lines()

    def kept_lines(self) -> list[str]:
        return [f"kept {path} ({reason}); remove it yourself if it can go" for path, reason in self.kept]


def remove_incomplete(output_dir: Path) -> Removal:
    """Delete zero-kit's checkpoint directories that a killed save (or removal) left behind (rank 0, once the run's
    inputs have passed); another tool's `checkpoint-N`, and a damaged checkpoint, are left alone."""
    _remove_deletions_cut_short(output_dir)
    done = Removal()
    for path in list_checkpoints(output_dir):
        if (path / REMOVING).is_file():
            _remove_listed(path)
        elif is_ours(path) and not is_complete(path) and damage(path) is None:
            done.delete(path)
    return done


def eval_loss_of(checkpoint_dir: Path) -> float | None:
    """The eval loss its manifest records (None: not evaluated, or not complete)."""
    try:
        value = json.loads((checkpoint_dir / MANIFEST).read_text(encoding="utf-8")).get("eval_loss")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def best_complete(output_dir: Path) -> Path | None:
    """The complete checkpoint with the lowest recorded eval loss (the newer one on a tie), or None."""
    scored = [
        (loss, p) for p in list_checkpoints(output_dir) if is_complete(p) and (loss := eval_loss_of(p)) is not None
    ]
    return min(scored, key=lambda item: (item[0], -checkpoint_step(item[1])))[1] if scored else None


def rotate(output_dir: Path, keep: int | None, keep_best: bool = False) -> list[Path]:
    """Keep the newest `keep` complete checkpoints (and with `keep_best` the one of the lowest eval loss besides);
    never delete the pointer's target."""
    if keep is None:
        return []
    complete = [p for p in list_checkpoints(output_dir) if is_complete(p)]
    best = best_complete(output_dir) if keep_best else None
    done = Removal()
    for path in [p for p in (complete[:-keep] if len(complete) > keep else []) if p != best]:
        done.delete(path)
    return done


def remove_all(output_dir: Path) -> Removal:
    """`--resume never`: forget every earlier zero-kit checkpoint so a later `--resume auto` cannot mix two runs
    (another tool's `checkpoint-N`, and files zero-kit did not write inside its own, stay; a damaged checkpoint is
    kept too). Returns what was deleted and kept."""
    (output_dir / POINTER).unlink(missing_ok=True)
    done = Removal()
    for path in list_checkpoints(output_dir):
        if not is_ours(path):
            continue
        what = damage(path)
        if what is not None:
            done.kept.append((path, f"damaged: {what}"))
        else:
            done.delete(path)
    return done

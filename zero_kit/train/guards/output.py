"""Whose --output is it (issue 52): zero-kit writes into a directory that is new, empty or its own, and never into
one that holds a user's files unless told so.

An output zero-kit wrote carries OUTPUT/.zero_kit_output, put there by rank 0 with the run record, before anything
else of the run is written. Before the claim, the relaunch or any deletion, the starting process checks --output:

- new or empty: the run's;
- marked: the run's, except a `final/` that holds files but no export's mark (zero_kit.export.checks.EXPORT_MARK),
  which the end-of-run export would replace. Files a user added beside zero-kit's own (notes, plots) stay where they
  are: zero-kit only writes and deletes the names below, and a `checkpoint-N` it did not write is never touched
  (zero_kit.checkpoints.store);
- unmarked but every entry one of zero-kit's names, with proof of a run (a checkpoint of its own, its run record,
  claim or heartbeats): an output of a release that did not mark outputs yet, adopted;
- anything else: refused in one line naming a few of the files zero-kit did not write and --overwrite-output.
  With --overwrite-output the run goes on: zero-kit's names are replaced, every other file is kept.
"""

from __future__ import annotations

from pathlib import Path

from zero_kit.checkpoints import store
from zero_kit.checkpoints.claim import CLAIM
from zero_kit.errors import UserError
from zero_kit.export.checks import EXPORT_MARK
from zero_kit.launch.hostfile import ENV_FILE, SECRETS_DIR
from zero_kit.log import RUN_LOG
from zero_kit.train.options import EFFECTIVE, TrainOptions
from zero_kit.train.startup import STARTUP_FILE
from zero_kit.train.stopping import LOG_FILE
from zero_kit.watchdog import HEARTBEAT_DIR

OUTPUT_MARK = ".zero_kit_output"
"""In every --output a run wrote: later runs may write and rotate there without --overwrite-output."""
FINAL_DIR = "final"
LOSS_PNG = "loss.png"
TRACKER_DIR = "runs"
"""TensorBoard's event files (zero_kit.train.startup points TENSORBOARD_LOGGING_DIR there)."""
OURS = frozenset({OUTPUT_MARK, CLAIM, HEARTBEAT_DIR, store.POINTER, store.RUN_INFO, EFFECTIVE, STARTUP_FILE, LOG_FILE,
                  LOSS_PNG, FINAL_DIR, TRACKER_DIR, ENV_FILE, SECRETS_DIR, "hostfile", RUN_LOG})  # fmt: skip
"""The names a run writes directly in --output, besides its `checkpoint-N` directories."""
PROOF = frozenset({CLAIM, HEARTBEAT_DIR, store.RUN_INFO, STARTUP_FILE})
"""Names only a zero-kit run writes in an output: with them, an unmarked output of zero-kit names is an earlier
release's."""
NAMED = 5
"""How many foreign entries a refusal names."""


def foreign_entries(output: Path) -> list[str]:
    """The entries of `output` (relative names) that zero-kit did not write and a run would overwrite or delete
    beside: [] for a new or empty output, or one of zero-kit's own."""
    try:
        entries = sorted(output.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    if not entries:
        return []
    final = output / FINAL_DIR
    final_foreign = [f"{FINAL_DIR}/{path.name}" for path in _listing(final)] if not _export_wrote(final) else []
    if (output / OUTPUT_MARK).is_file():
        return final_foreign
    names = [path.name for path in entries]
    unknown = [name for name in names if not _ours_by_name(output / name)]
    if not unknown and not final_foreign and (PROOF.intersection(names) or _has_own_checkpoint(output)):
        return []  # an earlier release's output
    return [name for name in names if name != FINAL_DIR or not final_foreign] + final_foreign


def check_output_is_ours(opts: TrainOptions) -> None:
    """Before the claim: refuse an --output holding files zero-kit did not write, unless --overwrite-output."""
    output = Path(opts.output)
    found = foreign_entries(output)
    if not found or opts.overwrite_output:
        return
    shown = ", ".join(found[:NAMED]) + (f" and {len(found) - NAMED} more" if len(found) > NAMED else "")
    raise UserError(
        f"--output {output}: holds files zero-kit did not write ({shown}); nothing was changed",
        "pass a new or empty --output, or add --overwrite-output to go on there (zero-kit's own files such as "
        "final/ and zero_kit_run.yaml are replaced; every other file is kept)",
    )


def mark(output: Path) -> None:
    """Rank 0, with the run record: this output is zero-kit's from now on."""
    if not (output / OUTPUT_MARK).is_file():
        store.atomic_write_text(output / OUTPUT_MARK, "written by zero-kit train: its runs may write here\n")


def _listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _export_wrote(final: Path) -> bool:
    """final/ is absent, empty, or an export's (its mark)."""
    return not _listing(final) or (final / EXPORT_MARK).is_file()


def _ours_by_name(path: Path) -> bool:
    name = path.name
    if name in OURS or name.startswith(".zero_kit"):  # its marks, and checkpoints being deleted
        return True
    if name.startswith(".") and any(name.startswith((f".{own}.tmp", f".{own}.partial")) for own in OURS):
        return True  # a write-then-rename a kill cut short
    return store.checkpoint_step(path) is not None and store.is_ours(path)


def _has_own_checkpoint(output: Path) -> bool:
    return any(store.is_ours(path) for path in store.list_checkpoints(output))

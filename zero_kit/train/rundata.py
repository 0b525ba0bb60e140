"""The data of a `zero-kit train` run (issue 23): --data (and --eval-data, or the --val-size hold-out) prepared once
into the data cache (zero_kit.data.cache) and memory-mapped by every rank.

`prepare` runs in every process of a run before any launcher, process group or op build: in the process that
relaunches itself under the `deepspeed` launcher it prepares (so a bad row is said before any rank starts, and the
ranks only load); the ranks of that launch find the entries ready; ranks an outside launcher started (torchrun,
deepspeed, srun, on each node) prepare a missing entry once per cache, the others waiting for it. `load` gives the
Trainer its datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from zero_kit.data.cache import DataSpec, Entry, default_cache_dir, prepared
from zero_kit.data.dataset import DataCollator, default_data_path, load_dataset_rows
from zero_kit.data.pipeline import Split
from zero_kit.data.preference import ASSET_PAIRS, PAIRS, load_pair_rows
from zero_kit.log import say
from zero_kit.model import ASSET_TOKENIZER
from zero_kit.train.options import TrainOptions


class Data(NamedTuple):
    dataset: Any
    collator: Any
    stats: Any
    eval_dataset: Any = None
    cache: str = ""  # the training data's cache entry (the run record names it)


class Prepared(NamedTuple):
    """The cache entries of a run: the training data (with the --val-size hold-out) and --eval-data's, if any."""

    train: Entry
    eval: Entry | None


def cache_dir(opts: TrainOptions) -> Path:
    return Path(opts.data_cache) if opts.data_cache else default_cache_dir()


def specs(opts: TrainOptions) -> tuple[DataSpec, DataSpec | None]:
    """What the run's training and eval data are made from. opts.model: already resolved to a directory."""
    fmt = PAIRS if opts.method == "dpo" else opts.format  # --method dpo reads preference pairs, whatever --format
    shape = {"fmt": fmt, "max_length": opts.max_length, "pack": opts.pack, "skip_bad": opts.skip_bad,
             "tokenizer_dir": opts.model or str(ASSET_TOKENIZER)}  # fmt: skip
    split = Split(opts.val_size, opts.seed) if opts.val_size is not None else None
    train = DataSpec((opts.data or default_data_path_of(fmt),), split=split, **shape)
    return train, (DataSpec((opts.eval_data,), **shape) if opts.eval_data is not None else None)


def prepare(opts: TrainOptions, speak: bool) -> Prepared:
    """The run's entries, found ready or built here; one line each where `speak` (or where this process built)."""
    from zero_kit.model import load_tokenizer

    loaded: list = []

    def tokenizer():  # loaded only when something is built, once
        if not loaded:
            loaded.append(load_tokenizer(opts.model, trust_remote_code=opts.trust_remote_code))
        return loaded[0]

    entries = []
    for what, spec in zip(("data", "eval data"), specs(opts), strict=True):
        if spec is None:
            entries.append(None)
            continue
        entry = prepared(spec, cache_dir(opts), lambda spec=spec: load_rows(spec), tokenizer)
        if speak or entry.built:
            done = f"prepared in {entry.seconds:.1f} s into" if entry.built else "reused the prepared"
            say(f"zero-kit train: {what}: {done} {entry.path}")
        entries.append(entry)
    return Prepared(*entries)


def default_data_path_of(fmt: str) -> str:
    """The bundled data of a format, or of --method dpo's pairs."""
    return str(ASSET_PAIRS) if fmt == PAIRS else default_data_path(fmt)


def load_rows(spec: DataSpec):
    """The rows of a spec's files, read as its format needs (pairs: zero_kit.data.preference)."""
    return load_pair_rows(list(spec.paths)) if spec.fmt == PAIRS else load_dataset_rows(list(spec.paths), spec.fmt)


def load(entries: Prepared, tokenizer, sp: int = 1, equal_length: int | None = None) -> Data:
    """The Trainer's datasets, memory-mapped from the cache, and the training data's stats (`sp`: --sp, which the
    collator pads for; `equal_length`: every batch padded to it, as gloo's gathers under --sp need)."""
    train, held, stats = entries.train.load()
    if entries.eval is not None:
        held, _, _ = entries.eval.load()
    collator = DataCollator.for_sp(tokenizer.pad_token_id, sp, equal_length)
    return Data(train, collator, stats, held, str(entries.train.path))

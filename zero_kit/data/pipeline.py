"""Tokenizing rows into training datasets with `datasets` (issue 23): what `tokenize_dataset` returns in memory and
what zero_kit.data.cache stores as Arrow files, by one pipeline.

1. The rows' positions go through `Dataset.map` (batched; in `num_proc` processes when the data is big enough to pay
   for them), each batch encoded by `encode_chunk`: every row becomes (input_ids, labels, attention_mask) or a bad
   row's reason and detail. The rows themselves are never pickled: forked workers inherit them (`_ROWS`).
2. Bad rows are reported (the first one, as file: row (line), with its fix) or, with skip_bad, counted by reason
   with the first place each reason was seen; nothing usable is an error either way.
3. The kept examples are held out for evaluation (`held_out`, by position) and packed (`pack_examples`, greedy and
   in order: the group boundaries come from the lengths alone, so batches of whole groups pack in parallel).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from zero_kit.data.files import Rows, Unparsed
from zero_kit.data.formats import IGNORE_INDEX, PREPARERS, BadRow, Prepared, finish, specials, tokenize_texts
from zero_kit.errors import UserError

SKIP_HINT = "use --skip-bad to skip and count such rows"
CHUNK_ROWS = 1000  # rows tokenized per batched call: fast, and memory stays bounded
ROWS_PER_PROCESS = 20_000
"""Below this many rows per process a worker's start (a fork, the tokenizer unpickled) costs more than it saves."""
UNREADABLE = "unreadable"  # a row the file's reader could not decode: always an error, never skipped
NOT_JSON = "not_json"  # a JSONL line that is not JSON (or not UTF-8): refused before tokenizing, or skipped

_ROWS: Rows | None = None
"""The rows being encoded, set around one `Dataset.map`: its forked workers inherit them instead of a pickled copy."""


@dataclass
class DataStats:
    """What happened to the rows: read, kept, skipped by reason (with the first place each reason was seen)."""

    rows_read: int = 0
    rows_kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    first_skipped: dict[str, str] = field(default_factory=dict)
    tokens: int = 0
    trained_tokens: int = 0
    sequences: int = 0

    def summary(self) -> str:
        skipped = ", ".join(
            f"{reason} {count} (first: {self.first_skipped[reason]})" for reason, count in self.skipped.items()
        )
        return (
            f"data: {self.rows_read} rows read, {self.rows_kept} kept, {sum(self.skipped.values())} skipped"
            f"{' [' + skipped + ']' if skipped else ''}; {self.tokens} tokens ({self.trained_tokens} trained) "
            f"in {self.sequences} sequences"
        )


@dataclass(frozen=True)
class Split:
    """A seeded hold-out of the examples for evaluation (--val-size, --seed)."""

    val_size: float
    seed: int


def held_out(count: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, eval) indices of `count` examples: round(count x fraction), at least one, held out by a shuffle
    seeded with `seed` (the same split on every rank and every run), each part in its original order."""
    import random

    n_eval = max(1, round(count * fraction))
    if n_eval >= count:
        raise UserError(
            f"--val-size {fraction:g} holds out {n_eval} of {count} examples: none is left to train on",
            "lower --val-size, or pass --eval-data FILE",
        )
    chosen = set(random.Random(seed).sample(range(count), n_eval))
    return [i for i in range(count) if i not in chosen], sorted(chosen)


def encode_chunk(chunk: list, tokenizer, fmt: str, max_length: int) -> list:
    """Each (source, index, row) -> (ids, labels) or BadRow, tokenizing the chunk's texts in one call."""
    prepared: list = []
    bos_eos = specials(tokenizer)
    for _source, _index, row in chunk:
        if isinstance(row, Unparsed):
            prepared.append(BadRow(NOT_JSON, row.detail))
            continue
        try:
            prepared.append(PREPARERS[fmt](row, tokenizer, bos_eos))
        except BadRow as bad:
            prepared.append(bad)
    texts = [text for item in prepared if isinstance(item, Prepared) for text in item.texts]
    encoded = iter(tokenize_texts(tokenizer, texts, with_offsets=fmt == "chat"))
    results = []
    for item in prepared:
        if isinstance(item, BadRow):
            results.append(item)
            continue
        try:
            results.append(finish(item, [next(encoded) for _ in item.texts], max_length))
        except BadRow as bad:
            results.append(bad)
    return results


def _encode_batch(batch: dict, tokenizer, fmt: str, max_length: int) -> dict:
    positions = batch["position"]
    try:
        chunk = list(_ROWS.span(positions[0], positions[-1] + 1))
    except UserError as err:  # a row the reader cannot decode: said by the parent, as it would say it
        chunk, failed = [], BadRow(UNREADABLE, str(err))
    names = ("input_ids", "labels", "attention_mask", "trained", "bad", "detail")
    columns: dict[str, list] = {name: [] for name in names}
    results = encode_chunk(chunk, tokenizer, fmt, max_length) if chunk else [failed] * len(positions)
    for result in results:
        ids, labels = ([], []) if isinstance(result, BadRow) else result
        columns["input_ids"].append(ids)
        columns["labels"].append(labels)
        columns["attention_mask"].append([1] * len(ids))
        columns["trained"].append(sum(label != IGNORE_INDEX for label in labels))
        columns["bad"].append(result.reason if isinstance(result, BadRow) else "")
        columns["detail"].append(result.detail if isinstance(result, BadRow) else "")
    return columns


def num_proc(rows: int) -> int | None:
    """Processes for `Dataset.map`: one per core the data pays for, none (this process) below two or without fork."""
    import multiprocess

    wanted = min(len(os.sched_getaffinity(0)), rows // ROWS_PER_PROCESS)
    return wanted if wanted > 1 and multiprocess.get_context().get_start_method() == "fork" else None


def _features(packed: bool):
    from datasets import Features, List, Value

    names = {"input_ids": "int32", "labels": "int32", "attention_mask": "int8"}
    if packed:
        names["position_ids"] = "int32"
    return Features({name: List(Value(dtype)) for name, dtype in names.items()})


def _map(source: dict, function, *, workdir: Path | None, name: str, features, fn_kwargs: dict, procs: int | None):
    """`function` over the `source` columns in batches: through `Dataset.map` into workdir/NAME.arrow
    (memory-mapped), with no fingerprint hashing (the tokenizer would be hashed) and no cache lookups (the caller
    decides what is cached); without a workdir (small data, in memory) the same batches go straight through
    `function`, since map's and from_dict's machinery (fingerprints) costs ~50 ms a call, more than a few rows take."""
    from datasets import Dataset

    if workdir is None:
        columns: dict[str, list] = {column: [] for column in features}
        for start in range(0, len(next(iter(source.values()))), CHUNK_ROWS):
            batch = {column: values[start : start + CHUNK_ROWS] for column, values in source.items()}
            for column, values in function(batch, **fn_kwargs).items():
                columns[column].extend(values)
        return in_memory(columns, features)
    dataset = Dataset.from_dict(source)
    return dataset.map(
        function,
        batched=True,
        batch_size=CHUNK_ROWS,
        fn_kwargs=fn_kwargs,
        features=features,
        remove_columns=dataset.column_names,
        num_proc=procs,
        keep_in_memory=workdir is None,
        cache_file_name=None if workdir is None else str(workdir / f"{name}.arrow"),
        load_from_cache_file=False,
        new_fingerprint=uuid.uuid4().hex,
        desc=f"zero-kit: {name}",
    )


def in_memory(columns: dict[str, list], features):
    """A Dataset of `columns`, fingerprinted at random rather than by hashing its data (nothing caches it)."""
    import pyarrow
    from datasets import Dataset, DatasetInfo
    from datasets.table import InMemoryTable

    table = pyarrow.Table.from_pydict(columns, schema=features.arrow_schema)
    return Dataset(InMemoryTable(table), info=DatasetInfo(features=features), fingerprint=uuid.uuid4().hex)


def encode_rows(rows: Rows, tokenizer, fmt: str, max_length: int, workdir: Path | None):
    """All rows encoded by `Dataset.map` (bad rows included, with their reason in `bad`)."""
    global _ROWS
    from datasets import Features, Value

    extra = {"trained": Value("int32"), "bad": Value("string"), "detail": Value("string")}
    features = Features({**_features(False), **extra})
    positions = {"position": list(range(len(rows)))}
    fn_kwargs = {"tokenizer": tokenizer, "fmt": fmt, "max_length": max_length}
    procs = num_proc(len(rows)) if workdir is not None else None
    if procs:  # the tokenizer's own threads must not be in use when the workers fork
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _ROWS = rows
    try:
        return _map(positions, _encode_batch, workdir=workdir, name="encoded", features=features,
                    fn_kwargs=fn_kwargs, procs=procs)  # fmt: skip
    finally:
        _ROWS = None


class progress_bars:
    """datasets' progress bars only where a person watches (a terminal); a log gets zero_kit's own lines."""

    def __init__(self, shown: bool):
        self.shown = shown

    def __enter__(self):
        import datasets

        self.was_enabled = not datasets.are_progress_bars_disabled()
        (datasets.enable_progress_bars if self.shown else datasets.disable_progress_bars)()

    def __exit__(self, *exc) -> None:
        import datasets

        (datasets.enable_progress_bars if self.was_enabled else datasets.disable_progress_bars)()


def _bad_row(bad: BadRow, where: str, fmt: str, max_length: int) -> UserError:
    first = f"raise --max-length (now {max_length})" if bad.reason == "too_long" else "fix the row"
    return UserError(f"{where}: {bad.detail} ({fmt} format)", f"{first}, or {SKIP_HINT}")


def check_bad_rows(encoded, rows: Rows, fmt: str, max_length: int, skip_bad: bool, stats: DataStats):
    """Positions of the usable examples; the first bad row raised, or (skip_bad) every one counted in stats."""
    import numpy
    import pyarrow.compute as pc

    reasons = encoded.data.column("bad")
    bad_positions = pc.indices_nonzero(pc.not_equal(reasons, "")).to_pylist()
    stats.rows_read = len(rows)
    details = encoded.data.column("detail")
    for position in bad_positions:
        bad = BadRow(reasons[position].as_py(), details[position].as_py())
        if bad.reason == UNREADABLE:
            raise UserError(*bad.detail.split("\n  fix: ", 1))
        source, index = rows.locate(position)
        if not skip_bad:
            raise _bad_row(bad, source.where(index), fmt, max_length)
        stats.skipped[bad.reason] += 1
        stats.first_skipped.setdefault(bad.reason, source.where(index))
    keep = numpy.ones(len(rows), dtype=bool)
    keep[bad_positions] = False
    if not keep.any():
        raise UserError(f"no usable rows: {stats.summary()}", "check the format and the data files")
    return numpy.flatnonzero(keep)


def pack_examples(examples: list, max_length: int, pad_id: int) -> dict[str, list]:
    """Greedy in-order packing into sequences of exactly max_length (see zero_kit.data.dataset)."""
    columns: dict[str, list] = {"input_ids": [], "labels": [], "attention_mask": [], "position_ids": []}
    current: dict[str, list] = {name: [] for name in columns}

    def flush() -> None:
        filler = max_length - len(current["input_ids"])
        if filler:  # a padding segment of its own: positions restart, no loss, mask 0
            current["input_ids"] += [pad_id] * filler
            current["labels"] += [IGNORE_INDEX] * filler
            current["attention_mask"] += [0] * filler
            current["position_ids"] += list(range(filler))
        for name in columns:
            columns[name].append(current[name])
            current[name] = []

    for ids, labels in examples:
        if len(current["input_ids"]) + len(ids) > max_length:
            flush()
        current["input_ids"] += ids
        current["labels"] += [IGNORE_INDEX] + labels[1:]  # never grade a prediction made across the boundary
        current["attention_mask"] += [1] * len(ids)
        current["position_ids"] += list(range(len(ids)))
    flush()
    return columns


def group_starts(lengths, max_length: int) -> list[int]:
    """Where each packed sequence starts (and, last, the end): the boundaries `pack_examples` draws, from lengths."""
    starts, used = [0], 0
    for position, length in enumerate(lengths):
        if used + length > max_length:
            starts.append(position)
            used = 0
        used += length
    return [*starts, len(lengths)]


def _pack_batch(batch: dict, examples, positions, starts: list[int], max_length: int, pad_id: int) -> dict:
    groups = batch["group"]
    picked = examples[positions[starts[groups[0]] : starts[groups[-1] + 1]].tolist()]
    return pack_examples(list(zip(picked["input_ids"], picked["labels"], strict=True)), max_length, pad_id)


def pad_id_of(tokenizer) -> int:
    # Filler tokens are their own segment with no loss, so any id works when a raw tokenizer lacks pad.
    return next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)


def _part(encoded, positions, stats: DataStats, *, pack: bool, max_length: int, pad_id: int, workdir, name: str):
    """The examples at `positions` as a training dataset (packed or plain), counted into stats."""
    import numpy
    import pyarrow.compute as pc

    lengths = pc.list_value_length(encoded.data.column("input_ids")).to_numpy()[positions]
    stats.rows_kept = len(positions)
    stats.tokens = int(lengths.sum())
    stats.trained_tokens = int(encoded.data.column("trained").to_numpy()[positions].sum())
    if pack:
        starts = group_starts(lengths.tolist(), max_length)
        groups = {"group": list(range(len(starts) - 1))}
        kwargs = {"examples": encoded, "positions": numpy.asarray(positions), "starts": starts,
                  "max_length": max_length, "pad_id": pad_id}  # fmt: skip
        procs = num_proc(len(positions)) if workdir is not None else None
        part = _map(groups, _pack_batch, workdir=workdir, name=f"{name}-packed", features=_features(True),
                    fn_kwargs=kwargs, procs=procs)  # fmt: skip
    else:
        plain = encoded.select(positions, new_fingerprint=uuid.uuid4().hex)
        part = plain.select_columns(["input_ids", "labels", "attention_mask"], new_fingerprint=uuid.uuid4().hex)
    stats.sequences = len(part)
    return part


def build_parts(rows: Rows, tokenizer, fmt: str, max_length: int, *, skip_bad: bool, pack: bool,
                split: Split | None = None, workdir: Path | None = None):  # fmt: skip
    """(train Dataset, eval Dataset or None, DataStats of the training part). Eval is the seeded hold-out of `split`,
    taken after tokenizing and before packing, so both parts are masked and packed alike. workdir: the Arrow files
    go there (memory-mapped), else everything stays in memory."""
    stats = DataStats()
    if not skip_bad:
        rows.refuse_unparsed()  # before any tokenizing (zero_kit.data.cache asks even before the tokenizer loads)
    with progress_bars(shown=workdir is not None and sys.stderr.isatty()):  # a log gets the cache's own lines
        encoded = encode_rows(rows, tokenizer, fmt, max_length, workdir)
    kept = check_bad_rows(encoded, rows, fmt, max_length, skip_bad, stats)
    with progress_bars(shown=False):
        return _parts(encoded, kept, stats, pack=pack, max_length=max_length, pad_id=pad_id_of(tokenizer),
                      workdir=workdir, split=split)  # fmt: skip


def _parts(encoded, kept, stats: DataStats, *, split: Split | None, **shape):
    if split is None:
        return _part(encoded, kept, stats, name="train", **shape), None, stats
    train_index, eval_index = held_out(len(kept), split.val_size, split.seed)
    held = _part(encoded, kept[eval_index], DataStats(), name="eval", **shape)
    return _part(encoded, kept[train_index], stats, name="train", **shape), held, stats

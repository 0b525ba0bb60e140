"""Training data: load rows (files or the bundled dataset), tokenize with prompt masking, pack, collate.

    rows = load_dataset_rows(["train.jsonl"], None)          # format guessed from the columns
    dataset, stats = tokenize_dataset(rows, tokenizer, rows.fmt, 512, skip_bad=True, pack=True)
    batch = collate([dataset[0], dataset[1]], pad_id=tokenizer.pad_token_id)

Formats (guessed from the columns when not given):
  alpaca  instruction, output, optional input -> ALPACA_PROMPT(_WITH_INPUT) + output + eos; the loss sees
          only output + eos.
  chat    messages: [{role: system|user|assistant, content}] rendered with the tokenizer's chat template
          (a JSON string in CSV cells is fine); the loss sees only the assistant turns (content + end marker).
  text    text -> bos + text + eos, all trained.
Rows that cannot be used (missing_field, wrong_type, empty, too_long) raise a UserError naming the file, row
and (JSONL) line, or with skip_bad are skipped and counted in DataStats. Nothing is truncated silently.

Packing (pack=True): examples are laid end to end (never split) into sequences of exactly max_length, filled
with a padding segment. `position_ids` restart at 0 for every example, and the first label of every example
is -100, so no token is graded on a prediction made from the previous example. `collate` leaves the
attention mask out of packed batches: given position_ids and no attention mask, transformers builds a
block-diagonal causal mask (masking_utils.find_packed_sequence_indices), so attention does not cross
examples either (tests/unit/test_data_packing.py: logits equal those of each example alone). That needs
use_cache=False, which the HF Trainer sets (TrainingArguments.use_cache defaults to False): with a KV-cache
object transformers skips the packed-sequence mask.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zero_kit.data.files import Rows, RowSource, read_source
from zero_kit.data.formats import (
    ALPACA_PROMPT,
    ALPACA_PROMPT_WITH_INPUT,
    FORMATS,
    IGNORE_INDEX,
    PREPARERS,
    BadRow,
    Prepared,
    check_tokenizer,
    finish,
    specials,
    tokenize_texts,
)
from zero_kit.errors import UserError

__all__ = [
    "ALPACA_PROMPT",
    "ALPACA_PROMPT_WITH_INPUT",
    "FORMATS",
    "IGNORE_INDEX",
    "DataStats",
    "Rows",
    "collate",
    "default_data_path",
    "guess_format",
    "held_out",
    "load_dataset_rows",
    "tokenize_dataset",
    "tokenize_split",
]

ASSET_DATA = Path(__file__).resolve().parents[1] / "assets" / "data"
SKIP_HINT = "use --skip-bad to skip and count such rows"
CHUNK_ROWS = 1000  # rows tokenized per batched call: fast, and memory stays bounded


def default_data_path(fmt: str = "alpaca") -> str:
    """The bundled example dataset for a format (JSONL inside the package)."""
    _check_format(fmt)
    return str(ASSET_DATA / f"{fmt}.jsonl")


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UserError(f"unknown data format {fmt!r}", f"use --format with one of {sorted(FORMATS)}")


def guess_format(columns: list[str], path: str = "") -> str:
    """alpaca if instruction+output, chat if messages, text if text; else a UserError listing the columns."""
    for fmt, required in FORMATS.items():
        if all(column in columns for column in required):
            return fmt
    raise UserError(
        f"{path or 'data'}: cannot tell the format from columns {columns[:12]}",
        "alpaca needs instruction/output, chat needs messages, text needs text; or pass --format",
    )


def load_dataset_rows(paths: list[str] | None, fmt: str | None) -> Rows:
    """Rows from the given files (or the bundled dataset for fmt when paths is None), format resolved."""
    if fmt is not None:
        _check_format(fmt)
    if not paths:
        paths = [default_data_path(fmt or "alpaca")]
    sources = [read_source(str(path)) for path in paths]
    fmt = fmt or guess_format(sources[0].columns, sources[0].path)
    for source in sources:
        missing = [column for column in FORMATS[fmt] if column not in source.columns]
        if missing:
            raise UserError(
                f"{source.path}: missing column(s) {missing} needed by the {fmt} format (has {source.columns[:12]})",
                "rename the columns, or pass the right --format",
            )
    return Rows(sources, fmt)


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


def _as_rows(rows: Rows | list[Any], fmt: str | None) -> Rows:
    if isinstance(rows, Rows):
        return rows
    return Rows([RowSource("<rows>", "list", list(rows), [])], fmt or "")


def _bad_row(bad: BadRow, where: str, fmt: str, max_length: int) -> UserError:
    first = f"raise --max-length (now {max_length})" if bad.reason == "too_long" else "fix the row"
    return UserError(f"{where}: {bad.detail} ({fmt} format)", f"{first}, or {SKIP_HINT}")


def _encode_chunk(chunk: list, tokenizer, fmt: str, max_length: int) -> list:
    """Each (source, index, row) -> (ids, labels) or BadRow, tokenizing the chunk's texts in one call."""
    prepared: list = []
    bos_eos = specials(tokenizer)
    for _source, _index, row in chunk:
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


def _encode_all(rows: Rows, tokenizer, fmt: str, max_length: int, skip_bad: bool, stats: DataStats) -> list:
    examples, chunk = [], []
    for position, item in enumerate(rows, 1):
        chunk.append(item)
        if len(chunk) < CHUNK_ROWS and position < len(rows):
            continue
        for (source, index, _row), result in zip(chunk, _encode_chunk(chunk, tokenizer, fmt, max_length), strict=True):
            stats.rows_read += 1
            if not isinstance(result, BadRow):
                examples.append(result)
            elif not skip_bad:
                raise _bad_row(result, source.where(index), fmt, max_length)
            else:
                stats.skipped[result.reason] += 1
                stats.first_skipped.setdefault(result.reason, source.where(index))
        chunk = []
    return examples


def tokenize_dataset(
    rows: Rows | list[Any], tokenizer, fmt: str | None, max_length: int, *, skip_bad: bool = False, pack: bool = False
):
    """(datasets.Dataset with input_ids/labels/attention_mask[/position_ids when packed], DataStats)."""
    examples, stats, pad_id = _examples(rows, tokenizer, fmt, max_length, skip_bad)
    return _to_dataset(examples, max_length, pad_id, pack, stats), stats


def tokenize_split(
    rows: Rows | list[Any],
    tokenizer,
    fmt: str | None,
    max_length: int,
    *,
    val_size: float,
    seed: int,
    skip_bad: bool = False,
    pack: bool = False,
):
    """(train Dataset, eval Dataset, DataStats of the training part): the examples are held out after tokenizing
    and before packing (`held_out`), so both parts are masked and packed exactly as training data is."""
    examples, stats, pad_id = _examples(rows, tokenizer, fmt, max_length, skip_bad)
    train_index, eval_index = held_out(len(examples), val_size, seed)
    eval_stats = DataStats()
    eval_set = _to_dataset([examples[i] for i in eval_index], max_length, pad_id, pack, eval_stats)
    train_set = _to_dataset([examples[i] for i in train_index], max_length, pad_id, pack, stats)
    return train_set, eval_set, stats


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


def _examples(rows: Rows | list[Any], tokenizer, fmt: str | None, max_length: int, skip_bad: bool):
    rows = _as_rows(rows, fmt)
    fmt = fmt or rows.fmt or guess_format(rows.sources[0].columns)
    _check_format(fmt)
    problem = check_tokenizer(tokenizer, fmt)
    if problem:
        raise UserError(f"cannot tokenize {fmt} data: {problem}", "use --format alpaca or text, or a model with one")
    if max_length < 2:
        raise UserError(f"max length {max_length} is too small", "use --max-length 2 or more (512 is typical)")
    stats = DataStats()
    examples = _encode_all(rows, tokenizer, fmt, max_length, skip_bad, stats)
    if not examples:
        raise UserError(f"no usable rows: {stats.summary()}", "check the format and the data files")
    # Filler tokens are their own segment with no loss, so any id works when a raw tokenizer lacks pad.
    pad_id = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)
    return examples, stats, pad_id


def _to_dataset(examples: list, max_length: int, pad_id: int, pack: bool, stats: DataStats):
    from datasets import Dataset

    stats.rows_kept = len(examples)
    stats.tokens = sum(len(ids) for ids, _ in examples)
    stats.trained_tokens = sum(sum(label != IGNORE_INDEX for label in labels) for _, labels in examples)
    columns = pack_examples(examples, max_length, pad_id) if pack else _plain_columns(examples)
    stats.sequences = len(columns["input_ids"])
    return Dataset.from_dict(columns)


def _plain_columns(examples: list) -> dict[str, list]:
    return {
        "input_ids": [ids for ids, _ in examples],
        "labels": [labels for _, labels in examples],
        "attention_mask": [[1] * len(ids) for ids, _ in examples],
    }


def pack_examples(examples: list, max_length: int, pad_id: int) -> dict[str, list]:
    """Greedy in-order packing into sequences of exactly max_length (see the module docstring)."""
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


def collate(features: list[dict], pad_id: int, pad_to_multiple_of: int | None = None) -> dict:
    """Pad to the longest sequence: input_ids with pad_id, labels with -100, attention_mask with 0.

    Packed features (with position_ids) come back without attention_mask, so the model builds its
    block-diagonal causal mask from the restarting position ids (module docstring).
    """
    import torch

    longest = max(len(feature["input_ids"]) for feature in features)
    if pad_to_multiple_of:
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    pads = {"input_ids": pad_id, "labels": IGNORE_INDEX, "attention_mask": 0, "position_ids": 0}
    names = [name for name in pads if name in features[0]]
    if "position_ids" in names:
        names.remove("attention_mask")
    return {
        name: torch.tensor([list(f[name]) + [pads[name]] * (longest - len(f[name])) for f in features])
        for name in names
    }


class DataCollator:
    """A Trainer-friendly collator: `DataCollator(tokenizer.pad_token_id)` called on a list of features."""

    def __init__(self, pad_id: int, pad_to_multiple_of: int | None = None):
        self.pad_id = pad_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict:
        return collate(features, self.pad_id, self.pad_to_multiple_of)

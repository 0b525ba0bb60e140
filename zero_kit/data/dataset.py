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
Rows that cannot be used (not_json: a JSONL line that does not parse; missing_field, wrong_type, empty, too_long)
raise a UserError naming the file, row and (JSONL) line, or with skip_bad are skipped and counted in DataStats.
Nothing is truncated silently.

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

from pathlib import Path
from typing import Any

from zero_kit.data.files import Rows, RowSource, data_files, read_source
from zero_kit.data.formats import ALPACA_PROMPT, ALPACA_PROMPT_WITH_INPUT, FORMATS, IGNORE_INDEX, check_tokenizer
from zero_kit.data.pipeline import SKIP_HINT, DataStats, Split, build_parts, held_out, pack_examples
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
    "pack_examples",
    "SKIP_HINT",
    "tokenize_dataset",
    "tokenize_split",
]

ASSET_DATA = Path(__file__).resolve().parents[1] / "assets" / "data"


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
    """Rows from the given files or directories of them (or the bundled dataset for fmt when paths is None), format
    resolved. A JSONL line that is not JSON is an Unparsed row: tokenize_dataset refuses it unless skip_bad."""
    if fmt is not None:
        _check_format(fmt)
    if not paths:
        paths = [default_data_path(fmt or "alpaca")]
    sources = [read_source(file) for path in paths for file in data_files(str(path))]
    parsed = [source for source in sources if len(source.unparsed) < len(source.rows)]  # a file of bad lines only:
    first = (parsed or sources)[0]  # no columns to check; its lines are refused, or skipped, with the bad rows
    fmt = fmt or guess_format(first.columns, first.path)
    for source in parsed:
        missing = [column for column in FORMATS[fmt] if column not in source.columns]
        if missing:
            raise UserError(
                f"{source.path}: missing column(s) {missing} needed by the {fmt} format (has {source.columns[:12]})",
                "rename the columns, or pass the right --format",
            )
    return Rows(sources, fmt)


def _as_rows(rows: Rows | list[Any], fmt: str | None) -> Rows:
    if isinstance(rows, Rows):
        return rows
    return Rows([RowSource("<rows>", "list", list(rows), [])], fmt or "")


def tokenize_dataset(
    rows: Rows | list[Any], tokenizer, fmt: str | None, max_length: int, *, skip_bad: bool = False, pack: bool = False
):
    """(datasets.Dataset with input_ids/labels/attention_mask[/position_ids when packed], DataStats), in memory.
    `zero-kit train` prepares the same through zero_kit.data.cache, once, into Arrow files every rank maps."""
    rows, fmt = _checked(rows, tokenizer, fmt, max_length)
    dataset, _, stats = build_parts(rows, tokenizer, fmt, max_length, skip_bad=skip_bad, pack=pack)
    return dataset, stats


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
    rows, fmt = _checked(rows, tokenizer, fmt, max_length)
    split = Split(val_size, seed)
    return build_parts(rows, tokenizer, fmt, max_length, skip_bad=skip_bad, pack=pack, split=split)


def _checked(rows: Rows | list[Any], tokenizer, fmt: str | None, max_length: int) -> tuple[Rows, str]:
    """The rows as Rows and their format, once the format, the tokenizer and max_length can encode them."""
    rows = _as_rows(rows, fmt)
    fmt = fmt or rows.fmt or guess_format(rows.sources[0].columns)
    _check_format(fmt)
    problem = check_tokenizer(tokenizer, fmt)
    if problem:
        raise UserError(f"cannot tokenize {fmt} data: {problem}", "use --format alpaca or text, or a model with one")
    if max_length < 2:
        raise UserError(f"max length {max_length} is too small", "use --max-length 2 or more (512 is typical)")
    return rows, fmt


def collate(features: list[dict], pad_id: int, pad_to_multiple_of: int | None = None, positions: bool = False,
            length: int | None = None) -> dict:  # fmt: skip
    """Pad to the longest sequence: input_ids with pad_id, labels with -100, attention_mask with 0.

    Packed features (with position_ids) come back without attention_mask, so the model builds its
    block-diagonal causal mask from the restarting position ids (module docstring). `positions`: unpacked rows get
    position_ids 0..length-1 too (Ulysses sequence parallelism needs them in every batch: a rank's shard keeps its
    tokens' global positions); the padding sits after each row, where a causal mask keeps it from every real token,
    and its labels are -100. `length`: pad every batch to at least this many tokens (gloo's all-gather, which
    Ulysses' data adapter runs over a group's batches, takes only tensors of one size).
    """
    import torch

    longest = max(length or 0, *(len(feature["input_ids"]) for feature in features))
    if pad_to_multiple_of:
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    pads = {"input_ids": pad_id, "labels": IGNORE_INDEX, "attention_mask": 0, "position_ids": 0}
    names = [name for name in pads if name in features[0]]
    if "position_ids" in names:
        names.remove("attention_mask")
    batch = {
        name: torch.tensor([list(f[name]) + [pads[name]] * (longest - len(f[name])) for f in features])
        for name in names
    }
    if positions and "position_ids" not in batch:
        batch["position_ids"] = torch.arange(longest).expand(len(features), longest).clone()
    return batch


class DataCollator:
    """A Trainer-friendly collator: `DataCollator(tokenizer.pad_token_id)` called on a list of features."""

    def __init__(self, pad_id: int, pad_to_multiple_of: int | None = None, positions: bool = False,
                 length: int | None = None):  # fmt: skip
        self.pad_id = pad_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.positions = positions
        self.length = length

    @classmethod
    def for_sp(cls, pad_id: int, sp: int, length: int | None = None) -> DataCollator:
        """Under sequence parallelism of `sp` (> 1): rows padded to a multiple of `sp` (each rank gets an equal
        shard), with position ids; `length`: every batch that long (CPU ranks: gloo gathers only equal sizes)."""
        return cls(pad_id, sp, positions=True, length=length) if sp > 1 else cls(pad_id)

    def __call__(self, features: list[dict]) -> dict:
        return collate(features, self.pad_id, self.pad_to_multiple_of, self.positions, self.length)

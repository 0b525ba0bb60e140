"""Preference pairs for `zero-kit train --method dpo` (issue 49): rows of prompt, chosen and rejected as TRL's
DPOTrainer reads them, checked and tokenized the way TRL tokenizes them, once, before any rank starts.

Rows are TRL's two kinds: plain (three strings) or conversational (`prompt` a list of {role, content} messages,
`chosen` and `rejected` lists of the answer's messages, rendered with the tokenizer's chat template). One file holds
one kind. TRL's implicit-prompt rows (no `prompt`, the whole conversation in chosen/rejected) are not read.

Tokenization is TRL's own (`DPOTrainer._prepare_dataset`, the same in TRL 0.29 and 1.16), mirrored here so that the
starting process can find a pair too long for --max-length and the ranks need not tokenize again: plain rows get the
eos token appended to chosen and rejected unless they end with it, and prompt, prompt+chosen and prompt+rejected are
each tokenized with the tokenizer's specials (bos); conversational rows render prompt (with the generation prompt),
prompt+chosen and prompt+rejected through the chat template. The answer starts where the tokenized prompt and
prompt+answer first differ. tests/unit/test_preference.py checks the ids against TRL's own preparation.

Bad rows, each named by file and row (or with --skip-bad skipped and counted by reason): missing_field, wrong_type,
empty, same (chosen equals rejected: nothing to prefer), too_long (prompt+chosen or prompt+rejected over
--max-length, which TRL would cut silently), not_json (a JSONL line that does not parse).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from zero_kit.data.files import Rows, Unparsed, data_files, read_source
from zero_kit.data.formats import BadRow, _check_encodable, check_message
from zero_kit.data.pipeline import NOT_JSON, UNREADABLE, DataStats, Split, check_bad_rows, held_out, in_memory
from zero_kit.errors import UserError

PAIRS = "preference"
"""The data kind of --method dpo (a data cache entry's format; the name bad rows are said with)."""
PAIR_FIELDS = ("prompt", "chosen", "rejected")
ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
"""The columns of a prepared pair: what TRL's DataCollatorForPreference reads."""
PAIR_TOKENIZATION = 1
"""Raise it when the ids of a pair change (TRL changes its tokenization): older cache entries are then not read."""
ASSET_PAIRS = Path(__file__).resolve().parents[1] / "assets" / "data" / "preference.jsonl"
"""The bundled preference set (scripts/make_preference_data.py), what --method dpo trains on without --data."""
CHUNK_PAIRS = 1000


def check_pair(row: Any) -> bool:
    """The checks of a pair that need no tokenizer: the three fields there, of one kind, not empty, chosen differing
    from rejected. True when the row is conversational; BadRow otherwise."""
    if isinstance(row, Unparsed):
        raise BadRow(NOT_JSON, row.detail)
    if not isinstance(row, dict):
        raise BadRow("wrong_type", f"expected an object with fields {list(PAIR_FIELDS)}, got {type(row).__name__}")
    missing = [name for name in PAIR_FIELDS if row.get(name) is None]
    if missing:
        raise BadRow("missing_field", f"missing field(s) {missing}")
    conversational = isinstance(row["prompt"], list)
    for name in PAIR_FIELDS:
        if conversational:
            _check_messages(row[name], name)
        elif not isinstance(row[name], str):
            raise BadRow(
                "wrong_type", f"field {name!r} must be a string (as 'prompt' is), got {type(row[name]).__name__}"
            )
        else:
            _check_encodable(row[name], f"field {name!r}")
            if not row[name].strip():
                raise BadRow("empty", f"field {name!r} is empty")
    if row["chosen"] == row["rejected"]:
        raise BadRow("same", "'chosen' equals 'rejected': the pair prefers nothing")
    return conversational


def _check_messages(value: Any, name: str) -> None:
    if not isinstance(value, list) or not value:
        raise BadRow("wrong_type", f"field {name!r} must be a non-empty list of {{role, content}} messages (as "
                                   "'prompt' is), or every field a string")  # fmt: skip
    for number, message in enumerate(value, 1):
        check_message(message, f"{name} message {number}")
    if name != "prompt" and not any(m["content"].strip() for m in value):
        raise BadRow("empty", f"field {name!r} has no text")


def _common_prefix(ids: list[int], other: list[int]) -> int:
    length = 0
    for a, b in zip(ids, other, strict=False):
        if a != b:
            break
        length += 1
    return length


def split_pair(prompt: list[int], prompt_chosen: list[int], prompt_rejected: list[int]) -> tuple[list, list, list]:
    """TRL's (prompt_ids, chosen_ids, rejected_ids): the answers start where the tokenized prompt and prompt+answer
    first differ (tokens may merge across the boundary)."""
    cut = min(_common_prefix(prompt, prompt_chosen), _common_prefix(prompt, prompt_rejected))
    return prompt[:cut], prompt_chosen[cut:], prompt_rejected[cut:]


def _texts(rows: list[dict], eos: str) -> list[str]:
    """prompt, prompt+chosen, prompt+rejected of each plain row, the answers ending in eos (TRL's add_eos)."""
    texts = []
    for row in rows:
        chosen, rejected = (a if a.endswith(eos) else a + eos for a in (row["chosen"], row["rejected"]))
        texts += [row["prompt"], row["prompt"] + chosen, row["prompt"] + rejected]
    return texts


def _render(tokenizer, messages: list, generation: bool = False) -> list[int]:
    from jinja2 import TemplateError

    try:
        done = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, add_generation_prompt=generation
        )
    except TemplateError as err:
        raise BadRow("wrong_type", f"the chat template rejected this conversation: {err}") from None
    return list(done["input_ids"])


def tokenize_pairs(rows: list[dict], conversational: list[bool], tokenizer) -> list:
    """(prompt_ids, chosen_ids, rejected_ids), or BadRow, for each checked row, as TRL tokenizes it."""
    plain = [row for row, chat in zip(rows, conversational, strict=True) if not chat]
    encoded = iter(tokenizer(_texts(plain, tokenizer.eos_token), verbose=False)["input_ids"]) if plain else iter(())
    results = []
    for row, chat in zip(rows, conversational, strict=True):
        try:
            if chat:
                prompt = _render(tokenizer, row["prompt"], generation=True)
                answers = [_render(tokenizer, row["prompt"] + row[name]) for name in ("chosen", "rejected")]
            else:
                prompt, answers = list(next(encoded)), [list(next(encoded)), list(next(encoded))]
            results.append(split_pair(prompt, *answers))
        except BadRow as bad:
            results.append(bad)
    return results


def encode_pair_chunk(chunk: list, tokenizer, max_length: int) -> list:
    """Each (source, index, row) of a chunk -> (prompt_ids, chosen_ids, rejected_ids) or BadRow; a pair is too long
    when prompt+chosen or prompt+rejected holds more than max_length tokens."""
    checked: list = []
    for _source, _index, row in chunk:
        try:
            checked.append((row, check_pair(row)))
        except BadRow as bad:
            checked.append(bad)
    good = [item for item in checked if not isinstance(item, BadRow)]
    encoded = iter(tokenize_pairs([row for row, _ in good], [chat for _, chat in good], tokenizer))
    results = []
    for item in checked:
        result = item if isinstance(item, BadRow) else next(encoded)
        if not isinstance(result, BadRow):
            longest = len(result[0]) + max(len(result[1]), len(result[2]))
            if longest > max_length:
                result = BadRow("too_long", f"{longest} tokens (prompt + the longer answer) is longer than the max "
                                            f"length {max_length}")  # fmt: skip
        results.append(result)
    return results


def load_pair_rows(paths: list[str] | None) -> Rows:
    """The rows of the given files or directories of them (the bundled preference set when none), their columns
    checked: a file without prompt/chosen/rejected is one error naming it and its columns."""
    files = [file for path in (paths or [str(ASSET_PAIRS)]) for file in data_files(str(path))]
    sources = [read_source(file) for file in files]
    for source in sources:
        missing = [column for column in PAIR_FIELDS if source.columns and column not in source.columns]
        if missing:
            raise UserError(
                f"{source.path}: missing column(s) {missing} needed by --method dpo (has {source.columns[:12]})",
                "give each row prompt, chosen and rejected (TRL's preference format)",
            )
    return Rows(sources, PAIRS)


def _features(with_checks: bool):
    from datasets import Features, List, Value

    columns = {name: List(Value("int32")) for name in ID_COLUMNS}
    if with_checks:
        columns.update(bad=Value("string"), detail=Value("string"))
    return Features(columns)


def _encode_all(rows: Rows, tokenizer, max_length: int):
    """Every row encoded, bad ones with their reason in `bad`, as a Dataset in memory."""
    columns: dict[str, list] = {name: [] for name in (*ID_COLUMNS, "bad", "detail")}
    for start in range(0, len(rows), CHUNK_PAIRS):
        try:
            chunk = list(rows.span(start, start + CHUNK_PAIRS))
            results = encode_pair_chunk(chunk, tokenizer, max_length)
        except UserError as err:  # a row the reader cannot decode: said as the reader says it
            results = [BadRow(UNREADABLE, str(err))] * len(range(start, min(start + CHUNK_PAIRS, len(rows))))
        for result in results:
            ids = ([], [], []) if isinstance(result, BadRow) else result
            for name, value in zip(ID_COLUMNS, ids, strict=True):
                columns[name].append(value)
            columns["bad"].append(result.reason if isinstance(result, BadRow) else "")
            columns["detail"].append(result.detail if isinstance(result, BadRow) else "")
    return in_memory(columns, _features(with_checks=True))


def _part(encoded, positions, stats: DataStats):
    """The pairs at `positions`, counted into stats: tokens of both sequences of each pair, trained tokens (the
    answers'), and two sequences per pair (what each step runs through the model)."""
    import pyarrow.compute as pc

    lengths = {name: pc.list_value_length(encoded.data.column(name)).to_numpy()[positions] for name in ID_COLUMNS}
    answers = int(lengths["chosen_ids"].sum() + lengths["rejected_ids"].sum())
    stats.rows_kept = len(positions)
    stats.trained_tokens = answers
    stats.tokens = answers + 2 * int(lengths["prompt_ids"].sum())
    stats.sequences = 2 * len(positions)
    picked = encoded.select(positions, new_fingerprint=uuid.uuid4().hex)
    return picked.select_columns(list(ID_COLUMNS), new_fingerprint=uuid.uuid4().hex)


def build_pairs(rows: Rows, tokenizer, fmt: str, max_length: int, *, skip_bad: bool, pack: bool,
                split: Split | None = None, workdir: Path | None = None):  # fmt: skip
    """(train Dataset, eval Dataset or None, DataStats of the training part) of preference pairs: what
    zero_kit.data.pipeline.build_parts is for the SFT formats (the same signature, so zero_kit.data.cache keeps
    either). Pairs are never packed; `workdir` is unused (pairs are small: the entry's files are written from
    memory)."""
    del fmt, workdir
    if pack:
        raise UserError("preference pairs cannot be packed", "drop --pack with --method dpo")
    if not skip_bad:
        rows.refuse_unparsed()
    stats = DataStats()
    encoded = _encode_all(rows, tokenizer, max_length)
    kept = check_bad_rows(encoded, rows, PAIRS, max_length, skip_bad, stats)
    if split is None:
        return _part(encoded, kept, stats), None, stats
    train_index, eval_index = held_out(len(kept), split.val_size, split.seed)
    held = _part(encoded, kept[eval_index], DataStats())
    return _part(encoded, kept[train_index], stats), held, stats

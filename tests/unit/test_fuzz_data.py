"""Fuzz the data loader (issue 6, item 5): malformed rows and files only ever raise UserError naming the file.

Rows: arbitrary JSON values under the format's field names. Files: valid files of each kind, then
truncated, bit-flipped, re-encoded (latin-1, UTF-16, cp1252) or replaced by random bytes. Any exception other
than UserError fails the test. Each test counts its own cases and checks that its property saw both outcomes it
must (so each passes or fails alone, in any order); `pytest -q -s tests/unit/test_fuzz_data.py` prints the counts.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zero_kit.data.dataset import load_dataset_rows, tokenize_dataset
from zero_kit.errors import UserError

FIELDS = ["instruction", "input", "output", "messages", "text", "role", "content"]
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Lone surrogate escapes are legal JSON but not text: the tokenizer rejects them with a TypeError.
strings = st.text(max_size=40) | st.sampled_from(["", " ", "\ud800", "ok\udfffok", "\x00", "<|assistant|>", "</s>"])
scalars = st.none() | st.booleans() | st.integers() | st.floats() | strings
good_rows = st.one_of(
    st.builds(lambda i, x, o: {"instruction": i, "input": x, "output": o}, strings, strings, strings),
    st.builds(
        lambda turns: {"messages": [{"role": r, "content": c} for r, c in turns]},
        st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), strings), min_size=1, max_size=5),
    ),
    st.builds(lambda text: {"text": text}, strings),
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "bot"]) | values, "content": values}
    ),
    max_size=4,
)
rows = st.one_of(
    good_rows,
    good_rows,
    st.builds(lambda row, key, value: {**row, key: value}, good_rows, st.sampled_from(FIELDS), values),
    st.dictionaries(st.sampled_from(FIELDS), values | st.text(max_size=80), max_size=5),
    st.fixed_dictionaries({"messages": messages}),
    values,
)


def check_result(dataset, stats, rows_in_file: int, max_length: int, pack: bool) -> None:
    """Invariants of an accepted dataset: counts add up, labels are -100 or the token, lengths fit."""
    assert stats.rows_read == rows_in_file
    assert stats.rows_kept + sum(stats.skipped.values()) == stats.rows_read
    assert stats.rows_kept > 0 and len(dataset) == stats.sequences
    for ids, labels in zip(dataset["input_ids"], dataset["labels"], strict=True):
        assert len(ids) == len(labels) and (len(ids) == max_length if pack else len(ids) <= max_length)
        assert all(label in (-100, token) for token, label in zip(ids, labels, strict=True))


def load_and_tokenize(
    path: str, tokenizer, fmt: str | None, max_length: int, skip_bad: bool, kind: str, cases: Counter, pack=False
):
    """The property: success, or a UserError that names the file. Anything else propagates and fails. Counts the
    outcome in `cases` under "KIND: accepted" or "KIND: UserError"."""
    try:
        loaded = load_dataset_rows([path], fmt)
        dataset, stats = tokenize_dataset(loaded, tokenizer, fmt, max_length, skip_bad=skip_bad, pack=pack)
        check_result(dataset, stats, len(loaded), max_length, pack)
        cases[f"{kind}: accepted"] += 1
    except UserError as err:
        assert path in str(err), str(err)
        cases[f"{kind}: UserError"] += 1


def report(test: str, cases: Counter) -> None:
    """The case counts of one test (pytest -s shows them)."""
    print(f"\n{test} cases:", dict(sorted(cases.items())), "total", sum(cases.values()))


@FUZZ
@given(
    batch=st.lists(rows, min_size=1, max_size=6),
    fmt=st.sampled_from([None, "alpaca", "chat", "text"]),
    max_length=st.integers(2, 96),
    skip_bad=st.booleans(),
    pack=st.booleans(),
)
def fuzz_rows(tokenizer, cases, batch, fmt, max_length, skip_bad, pack):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "rows.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in batch), encoding="utf-8")
        load_and_tokenize(str(path), tokenizer, fmt, max_length, skip_bad, "rows", cases, pack)


def test_fuzzed_rows_only_raise_user_errors(tokenizer):
    cases: Counter = Counter()
    fuzz_rows(tokenizer, cases)  # Hypothesis draws the rest, FUZZ.max_examples times
    report("fuzzed rows", cases)
    # the fuzzing reached both sides of the property: rows refused with a UserError, and rows accepted
    assert cases["rows: UserError"] > 0 and cases["rows: accepted"] > 0, cases


@settings(max_examples=100, deadline=None)
@given(
    triples=st.lists(
        st.tuples(st.text(min_size=1, max_size=60), st.text(max_size=30), st.text(min_size=1, max_size=60)),
        min_size=1,
        max_size=5,
    ),
)
def round_trip_alpaca(tokenizer, cases, triples):
    rows = [{"instruction": i, "input": x, "output": o} for i, x, o in triples]
    usable = [row for row in rows if row["instruction"].strip() and row["output"].strip()]
    try:
        dataset, stats = tokenize_dataset(rows, tokenizer, "alpaca", 512, skip_bad=True)
    except UserError as err:
        assert not usable and "no usable rows" in str(err)
        cases["alpaca round trip: no usable rows"] += 1
        return
    assert stats.rows_kept == len(usable) == len(dataset)
    for row, labels in zip(usable, dataset["labels"], strict=True):
        trained = [label for label in labels if label != -100]
        assert tokenizer.decode(trained) == row["output"] + tokenizer.eos_token
    cases["alpaca round trip: accepted"] += 1


def test_any_text_round_trips_through_alpaca_masking(tokenizer):
    """For any unicode, the trained tokens decode to exactly the output + eos (whitespace-only rows skipped)."""
    cases: Counter = Counter()
    round_trip_alpaca(tokenizer, cases)
    report("alpaca round trip", cases)
    assert cases["alpaca round trip: accepted"] > 0, cases  # some rows were kept and their outputs checked


def valid_bytes(kind: str) -> bytes:
    """A small valid file of each kind, the starting point for mutations."""
    import pandas

    good = [{"instruction": "Explain ZeRO.", "input": "", "output": "It shards state."}] * 3
    if kind == "jsonl":
        return "".join(json.dumps(row) + "\n" for row in good).encode()
    if kind == "json":
        return json.dumps(good).encode()
    buffer = io.BytesIO()
    (pandas.DataFrame(good).to_csv if kind == "csv" else pandas.DataFrame(good).to_parquet)(buffer, index=False)
    return buffer.getvalue()


def mutate(data: bytes, how: str, draw) -> bytes:
    if how == "truncate":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if how == "flip":
        spots = draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=6))
        mutable = bytearray(data)
        for spot in spots:
            mutable[spot] = draw(st.integers(0, 255))
        return bytes(mutable)
    if how == "reencode":
        text = data.decode("utf-8", errors="replace").replace("ZeRO", draw(st.sampled_from(["Zé", "Ω", "\u2028", "€"])))
        return text.encode(draw(st.sampled_from(["latin-1", "utf-16", "cp1252"])), errors="replace")
    return draw(st.binary(max_size=200))


@FUZZ
@given(
    kind=st.sampled_from(["jsonl", "json", "csv", "parquet"]),
    how=st.sampled_from(["truncate", "flip", "reencode", "random"]),
    fmt=st.sampled_from([None, "alpaca", "text"]),
    data=st.data(),
)
def fuzz_files(tokenizer, cases, kind, how, fmt, data):
    payload = mutate(valid_bytes(kind), how, data.draw)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"data.{kind}"
        path.write_bytes(payload)
        load_and_tokenize(str(path), tokenizer, fmt, 64, data.draw(st.booleans()), f"{kind}/{how}", cases)


def test_mutated_files_only_raise_user_errors(tokenizer):
    cases: Counter = Counter()
    fuzz_files(tokenizer, cases)
    report("mutated files", cases)
    # the mutations broke some files: the loader's refusals were exercised, not only its happy path
    assert sum(count for key, count in cases.items() if key.endswith(": UserError")) > 0, cases

"""Bad rows name file + row (+ line for JSONL) and the fix, or are skipped and counted; unreadable files are
UserErrors naming the file."""

from __future__ import annotations

import json

import pytest

from zero_kit.data.dataset import load_dataset_rows, tokenize_dataset
from zero_kit.errors import UserError

GOOD = {"instruction": "Explain ZeRO.", "input": "", "output": "It shards training state."}
BAD_ROWS = {  # reason -> (a bad alpaca row, words the error must contain)
    "missing_field": ({"instruction": "Explain ZeRO."}, "missing field 'output'"),
    "wrong_type": ({"instruction": "Explain ZeRO.", "output": 42}, "field 'output' must be a string, got int"),
    "empty": ({"instruction": "Explain ZeRO.", "output": "   "}, "field 'output' is empty"),
    "too_long": ({"instruction": "Explain ZeRO.", "output": "shard " * 300}, "tokens is longer than the max length 64"),
}
BAD_CHAT = {
    "wrong_type": ({"messages": [{"role": "robot", "content": "beep"}]}, "message 1 needs a 'role'"),
    "empty": ({"messages": [{"role": "user", "content": "hi"}]}, "no non-empty assistant message"),
}


def write_jsonl(path, rows, blank_lines_before: int = 0) -> str:
    lines = ["" for _ in range(blank_lines_before)] + [json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("reason", sorted(BAD_ROWS))
def test_bad_alpaca_row_names_file_row_line_and_fix(tmp_path, tokenizer, reason):
    bad, words = BAD_ROWS[reason]
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD, GOOD, bad, GOOD], blank_lines_before=2)
    rows = load_dataset_rows([path], "alpaca")
    with pytest.raises(UserError) as caught:
        tokenize_dataset(rows, tokenizer, "alpaca", 64)
    message = str(caught.value)
    assert f"{path}: row 3 (line 5): " in message and words in message
    assert "--skip-bad" in message
    if reason == "too_long":
        assert "--max-length" in message


def test_skip_bad_counts_each_reason(tmp_path, tokenizer):
    bad_rows = [bad for bad, _ in BAD_ROWS.values()] + ["not an object", [1, 2]]
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD, *bad_rows, GOOD, bad_rows[0]])
    dataset, stats = tokenize_dataset(load_dataset_rows([path], "alpaca"), tokenizer, "alpaca", 64, skip_bad=True)
    assert len(dataset) == stats.rows_kept == 2
    assert stats.rows_read == 9
    assert dict(stats.skipped) == {"missing_field": 2, "wrong_type": 3, "empty": 1, "too_long": 1}
    assert stats.first_skipped["missing_field"] == f"{path}: row 2 (line 2)"
    assert "7 skipped" in stats.summary() and "too_long 1" in stats.summary()


@pytest.mark.parametrize("reason", sorted(BAD_CHAT))
def test_bad_chat_rows(tmp_path, tokenizer, reason):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    bad, words = BAD_CHAT[reason]
    path = write_jsonl(tmp_path / "chat.jsonl", [good, bad])
    with pytest.raises(UserError, match=f"row 2 \\(line 2\\): {words}"):
        tokenize_dataset(load_dataset_rows([path], "chat"), tokenizer, "chat", 64)
    _, stats = tokenize_dataset(load_dataset_rows([path], "chat"), tokenizer, "chat", 64, skip_bad=True)
    assert dict(stats.skipped) == {reason: 1}


def test_bad_text_row_in_csv_names_row(tmp_path, tokenizer):
    path = tmp_path / "t.csv"
    path.write_text('text\n"ZeRO shards state."\n""\n', encoding="utf-8")
    with pytest.raises(UserError, match=f"{path}: row 2: field 'text' is empty"):
        tokenize_dataset(load_dataset_rows([str(path)], None), tokenizer, "text", 64)


def test_all_rows_bad_is_a_user_error_even_when_skipping(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": ""}])
    with pytest.raises(UserError, match="no usable rows"):
        tokenize_dataset(load_dataset_rows([path], "text"), tokenizer, "text", 64, skip_bad=True)


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


UNREADABLE = {  # file name -> (bytes, words the error must contain)
    "truncated.jsonl": (b'{"text": "a"}\n{"text": "b"}\n{"text": "unfinish', "line 3: not valid JSON"),
    "latin1.jsonl": ('{"text": "ok"}\n{"text": "caf\u00e9"}\n'.encode("latin-1"), "line 2: not valid UTF-8"),
    "utf16.json": (json.dumps([{"text": "a"}]).encode("utf-16"), "not valid UTF-8"),
    "scalar.json": (b"42", "expected a JSON list of row objects"),
    "nested.jsonl": (b"[" * 100000, "line 1: JSON that cannot be read"),
    "empty.jsonl": (b"\n\n", "holds no rows"),
    "bad.parquet": (b"PAR1 this is not parquet", "not a readable Parquet file"),
    "quotes.csv": (b'text\n"never closed\n', "not a readable CSV file"),
    "data.txt": (b"hello", "unknown file type '.txt'"),
}


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_unreadable_files_are_user_errors_naming_the_file(tmp_path, name):
    data, words = UNREADABLE[name]
    path = _write(tmp_path / name, data)
    with pytest.raises(UserError, match=words) as caught:
        load_dataset_rows([path], "text").refuse_unparsed()  # a JSONL line that is not JSON: a row until refused
    assert str(caught.value).startswith(path)


def test_missing_path_missing_column_and_bad_saved_dir(tmp_path):
    with pytest.raises(UserError, match="no such file or directory"):
        load_dataset_rows([str(tmp_path / "nope.jsonl")], None)
    path = _write(tmp_path / "a.csv", b"instruction,response\nhi,there\n")
    with pytest.raises(UserError, match=r"missing column\(s\) \['output'\]"):
        load_dataset_rows([path], "alpaca")
    (tmp_path / "not_saved").mkdir()
    with pytest.raises(UserError, match="not a datasets.save_to_disk directory"):
        load_dataset_rows([str(tmp_path / "not_saved")], None)


def test_lone_surrogate_escape_is_a_bad_row_not_a_crash(tmp_path, tokenizer):
    path = tmp_path / "s.jsonl"  # found by test_fuzz_data: the tokenizer raised TypeError on such strings
    path.write_text('{"text": "fine"}\n{"text": "bad \\ud800 here"}\n', encoding="utf-8")
    with pytest.raises(UserError, match="row 2 \\(line 2\\): field 'text' holds a lone surrogate"):
        tokenize_dataset(load_dataset_rows([str(path)], "text"), tokenizer, "text", 64)
    _, stats = tokenize_dataset(load_dataset_rows([str(path)], "text"), tokenizer, "text", 64, skip_bad=True)
    assert dict(stats.skipped) == {"wrong_type": 1}


def test_parquet_with_invalid_utf8_strings_is_a_user_error(tmp_path):
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / "bad.parquet"  # found by test_fuzz_data: rows failed to decode only when read
    column = pyarrow.array([b"\x80abc", b"ok"], type=pyarrow.binary()).view(pyarrow.string())
    pyarrow.parquet.write_table(pyarrow.table({"text": column}), path)
    with pytest.raises(UserError, match="Invalid UTF8") as caught:
        load_dataset_rows([str(path)], None)
    assert str(caught.value).startswith(str(path))

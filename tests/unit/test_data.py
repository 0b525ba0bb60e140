"""Data loading for every format x file kind, format guessing, prompt masking and collation."""

from __future__ import annotations

import json

import pytest

from zero_kit.data.dataset import (
    ALPACA_PROMPT,
    ALPACA_PROMPT_WITH_INPUT,
    IGNORE_INDEX,
    DataCollator,
    collate,
    default_data_path,
    load_dataset_rows,
    tokenize_dataset,
)
from zero_kit.errors import UserError
from zero_kit.model import load_tokenizer

KINDS = ["jsonl", "json", "csv", "parquet", "dataset-dir"]


def bundled_rows(fmt: str, count: int = 12) -> list[dict]:
    with open(default_data_path(fmt), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle][:count]


def write_rows(rows: list[dict], directory, kind: str) -> str:
    """Write rows as one file kind, the way a user would produce it."""
    import datasets
    import pandas

    path = directory / ("saved" if kind == "dataset-dir" else f"data.{kind}")
    if kind == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif kind == "json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif kind == "csv":  # a CSV cell holds the chat messages as a JSON string
        flat = [{k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()} for row in rows]
        pandas.DataFrame(flat).to_csv(path, index=False)
    elif kind == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["alpaca", "chat", "text"])
def test_each_format_loads_from_each_file_kind(tmp_path, tokenizer, fmt, kind):
    rows = bundled_rows(fmt)
    reference, _ = tokenize_dataset(rows, tokenizer, fmt, 256)
    loaded = load_dataset_rows([write_rows(rows, tmp_path, kind)], None)
    assert loaded.fmt == fmt  # guessed from the columns
    assert len(loaded) == len(rows)
    dataset, stats = tokenize_dataset(loaded, tokenizer, None, 256)
    assert (stats.rows_read, stats.rows_kept, sum(stats.skipped.values())) == (len(rows), len(rows), 0)
    assert dataset["input_ids"] == reference["input_ids"]
    assert dataset["labels"] == reference["labels"]
    assert set(dataset.column_names) == {"input_ids", "labels", "attention_mask"}


@pytest.mark.parametrize("fmt", ["alpaca", "chat", "text"])
def test_default_dataset_is_bundled_and_clean(tokenizer, fmt):
    rows = load_dataset_rows(None, fmt)
    assert rows.fmt == fmt and len(rows) >= 80
    dataset, stats = tokenize_dataset(rows, tokenizer, fmt, 256)
    assert stats.rows_kept == stats.rows_read == len(dataset)
    assert load_dataset_rows(None, None).fmt == "alpaca"


def test_alpaca_masks_exactly_the_prompt(tokenizer):
    rows = bundled_rows("alpaca", 40)
    assert any(row["input"] for row in rows) and any(not row["input"] for row in rows)
    dataset, _ = tokenize_dataset(rows, tokenizer, "alpaca", 256)
    for row, ids, labels in zip(rows, dataset["input_ids"], dataset["labels"], strict=True):
        template = ALPACA_PROMPT_WITH_INPUT if row["input"] else ALPACA_PROMPT
        prompt = [tokenizer.bos_token_id] + tokenizer(template.format(**row), add_special_tokens=False)["input_ids"]
        assert ids[: len(prompt)] == prompt
        assert labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
        assert labels[len(prompt) :] == ids[len(prompt) :]
        assert tokenizer.decode(labels[len(prompt) :]) == row["output"] + tokenizer.eos_token


def trained_runs(labels: list[int]) -> list[list[int]]:
    runs, current = [], []
    for label in labels + [IGNORE_INDEX]:
        if label != IGNORE_INDEX:
            current.append(label)
        elif current:
            runs.append(current)
            current = []
    return runs


def test_chat_trains_only_assistant_turns(tokenizer):
    rows = bundled_rows("chat", 20)
    dataset, _ = tokenize_dataset(rows, tokenizer, "chat", 256)
    for row, ids, labels in zip(rows, dataset["input_ids"], dataset["labels"], strict=True):
        expected = [m["content"] + tokenizer.eos_token for m in row["messages"] if m["role"] == "assistant"]
        assert [tokenizer.decode(run) for run in trained_runs(labels)] == expected
        assert all(label in (IGNORE_INDEX, token) for token, label in zip(ids, labels, strict=True))
        assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1


def test_text_trains_on_everything(tokenizer):
    rows = bundled_rows("text", 10)
    dataset, _ = tokenize_dataset(rows, tokenizer, "text", 256)
    for row, ids, labels in zip(rows, dataset["input_ids"], dataset["labels"], strict=True):
        assert labels == ids
        assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids[1:-1]) == row["text"]


def test_collate_pads_each_field_with_its_own_value(tokenizer):
    dataset, _ = tokenize_dataset(bundled_rows("alpaca", 4), tokenizer, "alpaca", 256)
    features = [dataset[i] for i in range(4)]
    batch = DataCollator(tokenizer.pad_token_id)(features)
    longest = max(len(f["input_ids"]) for f in features)
    assert batch["input_ids"].shape == (4, longest)
    for row, feature in enumerate(features):
        pad = longest - len(feature["input_ids"])
        assert batch["input_ids"][row, len(feature["input_ids"]) :].tolist() == [tokenizer.pad_token_id] * pad
        assert batch["labels"][row, len(feature["input_ids"]) :].tolist() == [IGNORE_INDEX] * pad
        assert batch["attention_mask"][row].tolist() == [1] * len(feature["input_ids"]) + [0] * pad
    assert collate(features, 0, pad_to_multiple_of=64)["input_ids"].shape[1] % 64 == 0


def test_format_guess_and_unknown_format_errors(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match="cannot tell the format") as caught:
        load_dataset_rows([str(path)], None)
    assert str(path) in str(caught.value) and "--format" in str(caught.value)
    with pytest.raises(UserError, match="unknown data format"):
        load_dataset_rows(None, "sharegpt")
    with pytest.raises(UserError, match=r"missing column\(s\) \['text'\]"):
        load_dataset_rows([str(path)], "text")


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
STRICT = "{% for m in messages %}{% if loop.index0 % 2 == 0 and m['role'] != 'user' %}{{ raise_exception('alternate') }}{% endif %}{{ m['content'] }}{% endfor %}"


def test_chat_masking_works_with_another_template(tokenizer, tmp_path):
    """A ChatML-style template (Qwen2 uses this layout): trained tokens are each reply plus its end marker."""
    tokenizer.save_pretrained(tmp_path)
    other = load_tokenizer(str(tmp_path))
    other.chat_template = CHATML
    rows = bundled_rows("chat", 6)
    dataset, _ = tokenize_dataset(rows, other, "chat", 256)
    for row, labels in zip(rows, dataset["labels"], strict=True):
        expected = "".join(m["content"] + "<|im_end|>\n" for m in row["messages"] if m["role"] == "assistant")
        assert "".join(other.decode(run) for run in trained_runs(labels)) == expected


def test_chat_needs_a_template_and_a_working_one(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    other = load_tokenizer(str(tmp_path))
    other.chat_template = None
    with pytest.raises(UserError, match="no chat template"):
        tokenize_dataset(bundled_rows("chat", 2), other, "chat", 256)
    other.chat_template = STRICT
    rows = [{"messages": [{"role": "assistant", "content": "hi"}]}, bundled_rows("chat", 1)[0]]
    with pytest.raises(UserError, match="row 1: the chat template rejected this conversation: alternate"):
        tokenize_dataset(rows, other, "chat", 256)


def test_several_files_of_different_kinds_load_together(tmp_path, tokenizer):
    rows = bundled_rows("alpaca", 6)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_rows(rows[:3], tmp_path / "a", "jsonl")
    second = write_rows(rows[3:] + [{"instruction": "No answer."}], tmp_path / "b", "parquet")
    loaded = load_dataset_rows([first, second], None)
    assert loaded.fmt == "alpaca" and len(loaded) == 7
    with pytest.raises(UserError, match=f"{second}: row 4: missing field 'output'"):
        tokenize_dataset(loaded, tokenizer, None, 256)
    dataset, stats = tokenize_dataset(loaded, tokenizer, None, 256, skip_bad=True)
    reference, _ = tokenize_dataset(rows, tokenizer, "alpaca", 256)
    assert dataset["input_ids"] == reference["input_ids"] and stats.first_skipped["missing_field"].startswith(second)


def test_saved_dataset_dict_uses_the_train_split(tmp_path, tokenizer):
    import datasets

    rows = bundled_rows("text", 4)
    splits = {"train": datasets.Dataset.from_list(rows[:3]), "test": datasets.Dataset.from_list(rows[3:])}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dict"))
    loaded = load_dataset_rows([str(tmp_path / "dict")], None)
    assert loaded.fmt == "text" and len(loaded) == 3
    del splits["train"]
    splits["validation"] = splits["test"]
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "no_train"))
    with pytest.raises(UserError, match="none is 'train'"):
        load_dataset_rows([str(tmp_path / "no_train")], None)

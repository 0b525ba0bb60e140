"""Packing: full max_length sequences, examples intact, no label or attention crossing example boundaries."""

from __future__ import annotations

import pytest
import torch

from zero_kit.data.dataset import IGNORE_INDEX, collate, load_dataset_rows, tokenize_dataset
from zero_kit.model import load_model

MAX_LENGTH = 128


def segments(position_ids: list[int]) -> list[tuple[int, int]]:
    starts = [i for i, position in enumerate(position_ids) if position == 0] + [len(position_ids)]
    return list(zip(starts, starts[1:], strict=False))


@pytest.mark.parametrize("fmt", ["alpaca", "chat", "text"])
def test_packing_keeps_examples_whole_and_masks_boundaries(tokenizer, fmt):
    rows = load_dataset_rows(None, fmt)
    plain, _ = tokenize_dataset(rows, tokenizer, fmt, MAX_LENGTH)
    packed, stats = tokenize_dataset(rows, tokenizer, fmt, MAX_LENGTH, pack=True)
    assert stats.sequences == len(packed) < len(plain)
    assert all(len(ids) == MAX_LENGTH for ids in packed["input_ids"])
    unpacked = []
    for ids, labels, positions, mask in zip(
        packed["input_ids"], packed["labels"], packed["position_ids"], packed["attention_mask"], strict=True
    ):
        for start, end in segments(positions):
            assert labels[start] == IGNORE_INDEX  # never predicted from the previous example
            assert positions[start:end] == list(range(end - start))
            if mask[start]:
                unpacked.append((ids[start:end], labels[start:end]))
            else:  # the filler segment: pad tokens, no loss
                assert set(ids[start:end]) == {tokenizer.pad_token_id} and set(labels[start:end]) == {IGNORE_INDEX}
    assert [ids for ids, _ in unpacked] == plain["input_ids"]  # every example once, in order, intact
    for (_, labels), reference in zip(unpacked, plain["labels"], strict=True):
        assert labels == [IGNORE_INDEX] + reference[1:]


def test_packed_logits_equal_each_example_alone(tokenizer):
    model = load_model(None, seed=0).eval()
    packed, _ = tokenize_dataset(load_dataset_rows(None, "text"), tokenizer, "text", MAX_LENGTH, pack=True)
    batch = collate([packed[0], packed[1]], tokenizer.pad_token_id)
    assert "attention_mask" not in batch  # so transformers derives the block-diagonal mask from position_ids
    with torch.no_grad():
        # use_cache=False as the HF Trainer sets it (TrainingArguments.use_cache defaults to False); with a
        # cache object transformers skips the packed-sequence mask.
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        checked = 0
        for row in range(2):
            for start, end in segments(batch["position_ids"][row].tolist())[:3]:
                alone = model(input_ids=batch["input_ids"][row : row + 1, start:end]).logits[0]
                torch.testing.assert_close(logits[row, start:end], alone, rtol=1e-4, atol=1e-4)
                checked += 1
    assert checked >= 4

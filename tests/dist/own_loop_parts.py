"""What the two own-loop scripts of test_own_loops.py (own_loop_accelerate.py, own_loop_deepspeed.py) share beside
the loop itself: their common command line, the numbered rows they train on, the two parameter groups, the batches
of the steps they take and the record each rank writes of the rows it read. What docs/own_script.md shows (the
accelerate or deepspeed calls, the save) stays in each script.

The scripts import it as a sibling module (the launcher runs a script's file, whose folder Python puts first on
sys.path). Like the scripts, it imports nothing of zero_kit."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from datasets import load_dataset

NO_DECAY = ("bias", "norm.weight")  # LLaMA's norms are input_layernorm / post_attention_layernorm / norm


def loop_arguments() -> argparse.ArgumentParser:
    """The flags both scripts take: --model_dir, --data_file, --output_dir, --max_steps, --lr."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--data_file", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    return parser


def numbered_rows(data_file: str, tokenizer):
    """The JSONL text rows tokenized to 64 tokens (labels: the ids, -100 on padding), each with its row number in
    a "row" column, as torch tensors."""
    data = load_dataset("json", data_files=data_file, split="train")
    data = data.add_column("row", list(range(len(data))))

    def tokenize(batch):
        encoded = tokenizer(batch["text"], max_length=64, truncation=True, padding="max_length")
        encoded["labels"] = [
            [token if keep else -100 for token, keep in zip(ids, mask, strict=True)]
            for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
        ]
        return encoded

    return data.map(tokenize, batched=True, remove_columns=["text"]).with_format("torch")


def param_groups(model) -> list[dict]:
    """AdamW's two groups, by LLaMA's names: weight decay 0.01, and none for biases and norms (docs/own_script.md,
    "The empty parameter group")."""
    return [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(NO_DECAY)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if n.endswith(NO_DECAY)], "weight_decay": 0.0},
    ]


def step_batches(loader: Iterable[dict], max_steps: int, rows: list[int]) -> Iterator[dict]:
    """The loader's batches for the first `max_steps` steps, each with its "row" column taken out into `rows`."""
    for step, batch in enumerate(loader):
        if step == max_steps:
            break
        rows += batch.pop("row").tolist()
        yield batch


def write_rows(out: Path, rows: list[int], world: int, index: int, **more) -> None:
    """OUT/rows_<index>.json: the rows this rank read and the world it saw (`more`: what else it saw); makes OUT."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rows_{index}.json").write_text(json.dumps({"rows": rows, "world": world, "index": index, **more}))

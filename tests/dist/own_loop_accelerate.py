"""A user's own training loop under `accelerate launch`, as docs/own_script.md shows it: its own AdamW with two
parameter groups, its own scheduler from transformers' `get_scheduler`, `accelerator.backward`, and a save through
`unwrap_model`. No Trainer and no zero_kit import: the one line a CPU-only host needs is marked.

Writes into --output_dir: the saved model (safetensors), `rows_<rank>.json` (the rows this rank read, and the world
it saw) and, on the main process, `losses.json` (the mean loss over ranks, per step).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator, InitProcessGroupKwargs
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler

NO_DECAY = ("bias", "norm.weight")  # LLaMA's norms are input_layernorm / post_attention_layernorm / norm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--data_file", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=4)
    parser.add_argument("--micro_batch", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    on_cpu = [] if torch.cuda.is_available() else [InitProcessGroupKwargs(backend="gloo")]  # the CPU line
    accelerator = Accelerator(kwargs_handlers=on_cpu)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir)  # ZeRO-3: built sharded (the YAML's zero3_init)

    data = load_dataset("json", data_files=args.data_file, split="train")
    data = data.add_column("row", list(range(len(data))))

    def tokenize(batch):
        encoded = tokenizer(batch["text"], max_length=64, truncation=True, padding="max_length")
        encoded["labels"] = [
            [token if keep else -100 for token, keep in zip(ids, mask, strict=True)]
            for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
        ]
        return encoded

    data = data.map(tokenize, batched=True, remove_columns=["text"]).with_format("torch")
    loader = DataLoader(data, batch_size=args.micro_batch, shuffle=False)

    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(NO_DECAY)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if n.endswith(NO_DECAY)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.lr)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=1, num_training_steps=args.max_steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    rows, losses = [], []
    for step, batch in enumerate(loader):
        if step == args.max_steps:
            break
        rows += batch.pop("row").tolist()
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    seen = {"rows": rows, "world": accelerator.num_processes, "index": accelerator.process_index,
            "distributed_type": str(accelerator.distributed_type).rsplit(".", 1)[-1]}  # fmt: skip
    (out / f"rows_{accelerator.process_index}.json").write_text(json.dumps(seen))
    accelerator.wait_for_everyone()
    state = accelerator.get_state_dict(model)  # ZeRO-3 gathers the whole weights (every rank takes part)
    accelerator.unwrap_model(model).save_pretrained(
        out, is_main_process=accelerator.is_main_process, save_function=accelerator.save, state_dict=state
    )
    if accelerator.is_main_process:
        tokenizer.save_pretrained(out)
        (out / "losses.json").write_text(json.dumps(losses))
    accelerator.end_training()


if __name__ == "__main__":
    main()

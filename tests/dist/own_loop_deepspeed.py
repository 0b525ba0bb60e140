"""A user's own training loop on `deepspeed.initialize`, under the `deepspeed` launcher, as docs/own_script.md
shows it: its own AdamW with two parameter groups (DeepSpeed's CPU Adam where the config offloads the optimizer,
which DeepSpeed requires), its own scheduler from transformers' `get_scheduler`, `engine.backward` / `engine.step`,
and a save of the whole weights that plain transformers loads. No Trainer and no zero_kit import.

Writes into --output_dir: the saved model (safetensors), `rows_<rank>.json` (the rows this rank read, and the world
it saw) and, on rank 0, `losses.json` (the mean loss over ranks, per step).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import deepspeed
import torch
from datasets import load_dataset
from deepspeed.ops.adam import DeepSpeedCPUAdam
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler
from transformers.integrations import HfDeepSpeedConfig

NO_DECAY = ("bias", "norm.weight")  # LLaMA's norms are input_layernorm / post_attention_layernorm / norm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--data_file", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    parser = deepspeed.add_config_arguments(parser)  # --deepspeed_config FILE
    args = parser.parse_args()

    config = json.loads(Path(args.deepspeed_config).read_text())
    deepspeed.init_distributed()  # before the model: ZeRO-3's zero.Init must count every rank
    keep = HfDeepSpeedConfig(config)  # noqa: F841 (alive while the model is built: ZeRO-3 builds it sharded)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir)

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
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    micro = config["train_micro_batch_size_per_gpu"]
    loader = DataLoader(data, batch_size=micro, sampler=DistributedSampler(data, world, rank, shuffle=False))

    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(NO_DECAY)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if n.endswith(NO_DECAY)], "weight_decay": 0.0},
    ]
    offload = config["zero_optimization"].get("offload_optimizer", {}).get("device", "none") != "none"
    optimizer = (DeepSpeedCPUAdam if offload else torch.optim.AdamW)(groups, lr=args.lr)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=1, num_training_steps=args.max_steps)
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
    )

    engine.train()
    rows, losses = [], []
    for step, batch in enumerate(loader):
        if step == args.max_steps:
            break
        rows += batch.pop("row").tolist()
        loss = engine(**{k: v.to(engine.device) for k, v in batch.items()}).loss
        engine.backward(loss)
        engine.step()  # the optimizer, the scheduler and zero_grad
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rows_{rank}.json").write_text(json.dumps({"rows": rows, "world": world, "index": rank}))
    # ZeRO-3 holds a shard of each weight per rank: gather them whole for the save (a no-op at stages 0-2).
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        if rank == 0:
            engine.module.save_pretrained(out)
            tokenizer.save_pretrained(out)
            (out / "losses.json").write_text(json.dumps(losses))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # before the interpreter exits: gloo's threads end cleanly


if __name__ == "__main__":
    main()

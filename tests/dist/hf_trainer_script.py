"""A user's own Hugging Face Trainer script, as a user writes one: no zero_kit import, every training option from the
Trainer's own `HfArgumentParser(TrainingArguments)`, the DeepSpeed config from wherever the launcher says, and the end
docs/own_script.md advises for CPU ranks (barrier, destroy, os._exit). Used by
tests/dist/test_third_party_clients.py as the script a zero-kit accelerate YAML launches:

    accelerate launch --config_file ACCELERATE_YAML tests/dist/hf_trainer_script.py \
        --model_dir DIR --data_file FILE.jsonl --output_dir OUT --use_cpu --max_steps 4 ...
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ScriptArguments:
    model_dir: str = field(metadata={"help": "a local model directory (save_pretrained) with its tokenizer"})
    data_file: str = field(metadata={"help": "a JSONL file of {'text': ...} rows"})
    max_length: int = field(default=64, metadata={"help": "tokens per example"})


def main() -> None:
    import torch.distributed
    from datasets import load_dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        HfArgumentParser,
        Trainer,
        TrainingArguments,
    )

    script, args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(script.model_dir)
    # After TrainingArguments, as the transformers docs ask: under ZeRO-3 this builds the model partitioned.
    model = AutoModelForCausalLM.from_pretrained(script.model_dir)
    rows = load_dataset("json", data_files=script.data_file, split="train")
    dataset = rows.map(
        lambda batch: tokenizer(batch["text"], truncation=True, max_length=script.max_length),
        batched=True,
        remove_columns=rows.column_names,
    )
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    trainer.save_model()
    trainer.save_state()  # trainer_state.json: the loss log
    if trainer.is_world_process_zero():  # what the ranks were, as the Trainer saw them
        seen = {
            "world_size": args.world_size,
            "process_index": args.process_index,
            "deepspeed": trainer.is_deepspeed_enabled,
        }
        Path(args.output_dir, "ranks.json").write_text(json.dumps(seen))
    # The end docs/own_script.md advises: the ranks meet (rank 0 has written its files), the process group ends, and
    # each rank leaves without interpreter teardown, in which torch's gloo threads can abort a CPU rank after a
    # finished run (exit 250; CI saw this script's rank 1 do so).
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

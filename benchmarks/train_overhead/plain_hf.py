"""Side B of the train_overhead study: the plain Hugging Face Trainer, nothing of zero_kit. transformers, datasets,
DeepSpeed and torch only, as a user would write it for a CPU run (docs/own_script.md, "What a CPU run needs").
One rank; started by the `deepspeed` launcher with the same flags `zero-kit train --nproc 2` uses:

    python -m deepspeed.launcher.runner --num_gpus 2 --master_port 29555 --no_local_rank \\
        --module benchmarks.train_overhead.plain_hf --model DIR --data DIR --ds-config ds.json --output OUT \\
        --max-steps 40 --timing OUT/timing

What it adds to the Trainer is the measurement, the same one zero-kit train makes (its ThroughputCallback, first in
its callback list): a perf_counter at on_train_begin and at every log event (every step: logging_steps=1), first
in the callback list. The collator is transformers' DataCollatorForSeq2Seq (pad to the longest, labels with -100),
wrapped to count this rank's non-padding tokens per micro batch on the side (no collective: the study sums the
ranks afterwards). Each rank writes TIMING/rank<R>.json at the end. `--tokens-seen non_padding` turns on the Trainer's
own token count that zero-kit train uses (a gather across the ranks per micro batch): that one piece alone.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from transformers import TrainerCallback


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory (with its tokenizer)")
    parser.add_argument("--data", required=True, help="a tokenized dataset saved with save_to_disk")
    parser.add_argument("--ds-config", required=True, help="DeepSpeed JSON ('auto' values filled by the Trainer)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--timing", required=True, help="directory for rank<R>.json")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-scheduler", default="cosine")
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens-seen", choices=("no", "all", "non_padding"), default="no",
                        help="include_num_input_tokens_seen (the Trainer's default: no; zero-kit train: non_padding)")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import deepspeed
    import torch
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments

    targs = TrainingArguments(
        output_dir=args.output,
        deepspeed=json.loads(Path(args.ds_config).read_text()),
        use_cpu=True,
        ddp_backend="gloo",
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.grad_accum,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type=args.lr_scheduler,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        logging_steps=1,
        seed=args.seed,
        data_seed=args.seed,
        save_strategy="no",
        report_to="none",
        remove_unused_columns=False,
        include_num_input_tokens_seen=args.tokens_seen,
    )
    # ZeRO-3's zero.Init reads the world size from deepspeed.comm, which nothing brings up on CPU before
    # deepspeed.initialize (docs/own_script.md): up before the model, with the arguments' backend
    deepspeed.init_distributed(dist_backend="gloo")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    collator = CountingCollator(DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100))
    clock = StepClock()
    trainer = Trainer(model=model, args=targs, train_dataset=load_from_disk(args.data), data_collator=collator,
                      processing_class=tokenizer, callbacks=[clock])  # fmt: skip
    handler = trainer.callback_handler
    handler.callbacks.insert(0, handler.pop_callback(clock))  # first at each event, as zero-kit's clock is
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.timing)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "steps": clock.steps,
        "tokens_per_micro_batch": collator.tokens,
        "threads": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "torch": torch.get_num_threads()},
        "training_arguments": json.loads(targs.to_json_string()),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record) + "\n")
    # leave together: a rank that exits while its peer's gloo threads still talk aborts ("terminate called")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


class CountingCollator:
    """The collator, and this rank's non-padding tokens of each micro batch it made, in order."""

    def __init__(self, collator):
        self.collator = collator
        self.tokens: list[int] = []

    def __call__(self, features):
        batch = self.collator(features)
        self.tokens.append(int(batch["attention_mask"].sum()))
        return batch


class StepClock(TrainerCallback):
    """perf_counter at the start of training and at each step's log event (rank 0's are the ones read)."""

    def __init__(self):
        self.start: float | None = None
        self.steps: list[dict] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and self.start is not None:
            now = time.perf_counter()
            self.steps.append({"step": state.global_step, "t": now - self.start, "loss": logs["loss"],
                               "wall": time.time()})  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())

"""A user's own training loop under `accelerate launch`, as docs/own_script.md shows it: its own AdamW with two
parameter groups, its own scheduler from transformers' `get_scheduler`, `accelerator.backward`, and a save through
`unwrap_model`. No Trainer and no zero_kit import: the one line a CPU-only host needs is marked, and the one that keeps DeepSpeed's
unused shm op from starting (and leaving its buffers in /dev/shm).

Writes into --output_dir: the saved model (safetensors), `rows_<rank>.json` (the rows this rank read, and the world
it saw) and, on the main process, `losses.json` (the mean loss over ranks, per step). The parts it shares with the other
own loop (command line, numbered rows, parameter groups, the rows record) are in own_loop_parts.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import deepspeed.ops
import torch
from accelerate import Accelerator, InitProcessGroupKwargs
from own_loop_parts import loop_arguments, numbered_rows, param_groups, step_batches, write_rows
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler


def main() -> None:
    parser = loop_arguments()  # --model_dir --data_file --output_dir --max_steps --lr (own_loop_parts.py)
    parser.add_argument("--micro_batch", type=int, default=2)
    args = parser.parse_args()

    on_cpu = [] if torch.cuda.is_available() else [InitProcessGroupKwargs(backend="gloo")]  # the CPU line
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no unused shm op, nothing left in /dev/shm
    accelerator = Accelerator(kwargs_handlers=on_cpu)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir)  # ZeRO-3: built sharded (the YAML's zero3_init)

    data = numbered_rows(args.data_file, tokenizer)  # each with its row number, for rows_<rank>.json
    loader = DataLoader(data, batch_size=args.micro_batch, shuffle=False)

    groups = param_groups(model)  # decay, and none for LLaMA's biases and norms
    optimizer = torch.optim.AdamW(groups, lr=args.lr)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=1, num_training_steps=args.max_steps)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    rows, losses = [], []
    for batch in step_batches(loader, args.max_steps, rows):  # the "row" column goes into rows
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())

    out = Path(args.output_dir)
    distributed_type = str(accelerator.distributed_type).rsplit(".", 1)[-1]
    write_rows(out, rows, accelerator.num_processes, accelerator.process_index, distributed_type=distributed_type)
    accelerator.wait_for_everyone()
    state = accelerator.get_state_dict(model)  # ZeRO-3 gathers the whole weights (every rank takes part)
    accelerator.unwrap_model(model).save_pretrained(
        out, is_main_process=accelerator.is_main_process, save_function=accelerator.save, state_dict=state
    )
    if accelerator.is_main_process:
        tokenizer.save_pretrained(out)
        (out / "losses.json").write_text(json.dumps(losses))
    accelerator.end_training()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown, which can abort a CPU rank after the save (docs/own_script.md, exit 250)


if __name__ == "__main__":
    main()

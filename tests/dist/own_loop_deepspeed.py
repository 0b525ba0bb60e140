"""A user's own training loop on `deepspeed.initialize`, under the `deepspeed` launcher, as docs/own_script.md
shows it: its own AdamW with two parameter groups (DeepSpeed's CPU Adam where the config offloads the optimizer,
which DeepSpeed requires), its own scheduler from transformers' `get_scheduler`, `engine.backward` / `engine.step`,
and a save of the whole weights that plain transformers loads. No Trainer and no zero_kit import.

Writes into --output_dir: the saved model (safetensors), `rows_<rank>.json` (the rows this rank read, and the world
it saw) and, on rank 0, `losses.json` (the mean loss over ranks, per step). The parts it shares with the other
own loop (command line, numbered rows, parameter groups, the rows record) are in own_loop_parts.py.

`--then CONFIG OUTPUT_DIR` (repeatable; the test's, not the user's) trains one more config after the first in the
same ranks, from a fresh model, optimizer and engine (the last one destroyed): test_own_loops.py runs ZeRO-2 and
ZeRO-3 with offload in one launch, as tests/dist/preset_steps.py runs presets.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import deepspeed
import deepspeed.ops
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
from own_loop_parts import loop_arguments, numbered_rows, param_groups, step_batches, write_rows
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler
from transformers.integrations import HfDeepSpeedConfig


def main() -> None:
    parser = loop_arguments()  # --model_dir --data_file --output_dir --max_steps --lr (own_loop_parts.py)
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    parser.add_argument("--then", nargs=2, action="append", default=[], metavar=("CONFIG", "OUTPUT_DIR"))
    parser = deepspeed.add_config_arguments(parser)  # --deepspeed_config FILE
    args = parser.parse_args()

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no unused shm op, nothing left in /dev/shm
    deepspeed.init_distributed()  # before the model: ZeRO-3's zero.Init must count every rank
    for config_file, output_dir in [(args.deepspeed_config, args.output_dir), *args.then]:
        train(args, json.loads(Path(config_file).read_text()), Path(output_dir))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # before the interpreter exits: gloo's threads end cleanly
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown, which can abort a CPU rank after the save (docs/own_script.md, exit 250)


def train(args, config: dict, out: Path) -> None:
    """One run of the loop on `config`, saved into `out`: what docs/own_script.md shows."""
    keep = HfDeepSpeedConfig(config)  # noqa: F841 (alive while the model is built: ZeRO-3 builds it sharded)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir)

    data = numbered_rows(args.data_file, tokenizer)  # each with its row number, for rows_<rank>.json
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    micro = config["train_micro_batch_size_per_gpu"]
    loader = DataLoader(data, batch_size=micro, sampler=DistributedSampler(data, world, rank, shuffle=False))

    groups = param_groups(model)  # decay, and none for LLaMA's biases and norms
    offload = config["zero_optimization"].get("offload_optimizer", {}).get("device", "none") != "none"
    optimizer = (DeepSpeedCPUAdam if offload else torch.optim.AdamW)(groups, lr=args.lr)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=1, num_training_steps=args.max_steps)
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
    )

    engine.train()
    rows, losses = [], []
    for batch in step_batches(loader, args.max_steps, rows):  # the "row" column goes into rows
        loss = engine(**{k: v.to(engine.device) for k, v in batch.items()}).loss
        engine.backward(loss)
        engine.step()  # the optimizer, the scheduler and zero_grad
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)

    write_rows(out, rows, world, rank)
    # ZeRO-3 holds a shard of each weight per rank: gather them whole for the save (a no-op at stages 0-2).
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        if rank == 0:
            engine.module.save_pretrained(out)
            tokenizer.save_pretrained(out)
            (out / "losses.json").write_text(json.dumps(losses))
    torch.distributed.barrier()
    engine.destroy()  # its hooks and buffers go before a --then config's engine is built in the same ranks


if __name__ == "__main__":
    main()

"""One rank of real DeepSpeed runs of presets, one after another in the same ranks: for each, a fresh tiny LLaMA
(inside zero.Init at ZeRO-3), its own engine, a few optimizer steps, results as JSON (R.json.<preset>.rank<r>).

Launched by tests/dist/test_presets_run.py as
    deepspeed --num_gpus 2 --master_port PORT tests/dist/preset_steps.py --config ds_configs/zero1.json \
        --config ds_configs/zero3.json --steps 3 --out R.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import deepspeed
import torch

from zero_kit.dist import end_process_group, exit_rank
from zero_kit.launch.ops import skip_shm_op
from zero_kit.model import tiny_llama_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, action="append", help="a preset's JSON; repeat for several")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # appended by the deepspeed launcher
    args = parser.parse_args()

    skip_shm_op()  # what zero-kit's ranks do: no unused shm op, nothing left in /dev/shm
    deepspeed.init_distributed(dist_backend="gloo")
    for path in args.config:
        result = _steps(path, args.steps)
        with open(f"{args.out}.{Path(path).stem}.rank{result['rank']}", "w", encoding="utf-8") as f:
            json.dump(result, f)
    end_process_group(finished=True)


def _steps(path: str, steps: int) -> dict:
    config = json.loads(Path(path).read_text(encoding="utf-8"))
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    with deepspeed.zero.Init(config_dict_or_path=config, enabled=config["zero_optimization"]["stage"] == 3):
        model = LlamaForCausalLM(tiny_llama_config(vocab_size=256, num_hidden_layers=2))
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    micro = engine.train_micro_batch_size_per_gpu()
    generator = torch.Generator().manual_seed(1234 + rank)
    losses = []
    for _ in range(steps * engine.gradient_accumulation_steps()):
        tokens = torch.randint(0, 256, (micro, 32), generator=generator)
        loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    result = {
        "rank": rank,
        "world_size": world,
        "stage": engine.zero_optimization_stage(),
        "global_steps": engine.global_steps,
        "dtype": str(next(engine.module.parameters()).dtype),
        "optimizer": type(optimizer).__name__,
        "inner_optimizer": type(getattr(optimizer, "optimizer", optimizer)).__name__,
        "losses": losses,
        "finite": all(math.isfinite(x) for x in losses),
    }
    engine.destroy()  # its hooks and buffers go before the next preset's engine is built in the same ranks
    return result


if __name__ == "__main__":
    main()
    exit_rank(0)  # interpreter teardown of a ZeRO-3 rank can abort (see there)

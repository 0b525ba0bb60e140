"""The CPU traps `zero-kit validate --for hf-trainer -- ARGS` reports, on real CPU ranks: what accelerate (inside
TrainingArguments and the Trainer) counts and whether the Trainer runs DeepSpeed at all.

    deepspeed --num_gpus 2 --master_port P tests/dist/hf_cpu_traps_probe.py --config CFG --out DIR

In this order (each TrainingArguments resets accelerate's state; the process group of the first stays up):
1. TrainingArguments(deepspeed=CFG) without use_cpu: the processes accelerate counts (args.world_size).
2. The same with use_cpu and ACCELERATE_USE_CPU=1, then a Trainer: does it use DeepSpeed?
3. use_cpu without ACCELERATE_USE_CPU, then a Trainer: its process count and whether it uses DeepSpeed.
Writes DIR/rank{R}.json (rank_probe.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from rank_probe import run_rank

from zero_kit.model import load_model


def arguments(config: str, out: Path, use_cpu: bool):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(out / "trainer"), deepspeed=config, use_cpu=use_cpu, report_to=[])


def trainer_record(args) -> dict:
    """A real Trainer on these arguments (the embedded tiny model): does it hand training to DeepSpeed?"""
    from accelerate.state import AcceleratorState
    from transformers import Trainer

    trainer = Trainer(model=load_model(None, seed=0), args=args)
    return {
        "is_deepspeed_enabled": trainer.is_deepspeed_enabled,
        "distributed_type": str(AcceleratorState().distributed_type),
        "num_processes": trainer.accelerator.num_processes,
    }


def probe(config: str, out: Path) -> dict:
    record = {"launched_world_size": int(os.environ["WORLD_SIZE"])}
    without = arguments(config, out, use_cpu=False)
    record["without_use_cpu"] = {
        "args_world_size": without.world_size,
        "args_process_index": without.process_index,
        "distributed_type": str(without.distributed_state.distributed_type),
        "process_group_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else None,
    }
    os.environ["ACCELERATE_USE_CPU"] = "1"
    record["accelerate_use_cpu_env"] = trainer_record(arguments(config, out, use_cpu=True))
    del os.environ["ACCELERATE_USE_CPU"]
    with_cpu = arguments(config, out, use_cpu=True)
    record["use_cpu"] = {"args_world_size": with_cpu.world_size, **trainer_record(with_cpu)}
    return record


if __name__ == "__main__":
    run_rank(probe)

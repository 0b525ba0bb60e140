"""The HF Trainer's ZeRO-3 path on CPU ranks, with and without a train_batch_size key: TrainingArguments(deepspeed=
CFG, use_cpu=True), then from_pretrained, which builds the model inside deepspeed.zero.Init.

    deepspeed --num_gpus 2 --master_port P tests/dist/hf_zero3_batch_probe.py --config CFG --out DIR

Tries, in this order (zero.Init brings DeepSpeed's communication up on the first success, so the failing variants
go first): the key "auto", the key as a number (micro x accum x world), the key absent (CFG as generated), and
"auto" again now that the communication is up (as on GPU hosts, where accelerate brings it up before the model).
For each: whether the model was built (partitioned), DeepSpeed's message if not, the train_batch_size the Trainer
filled and the one DeepSpeed derives from the Trainer's filled config at the real world size. Writes
DIR/rank{R}.json (rank_probe.py).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from rank_probe import run_rank

from zero_kit.model import load_model

MICRO, ACCUM = 2, 3


def try_variant(config: dict, model_dir: Path, out: Path) -> dict:
    """TrainingArguments then from_pretrained under `config`; what happened."""
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import AutoModelForCausalLM, TrainingArguments

    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        deepspeed=copy.deepcopy(config),
        use_cpu=True,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUM,
        report_to=[],
    )
    filled = args.hf_deepspeed_config.config
    record = {"args_world_size": args.world_size, "filled_train_batch_size": filled.get("train_batch_size")}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - the probe records what the real code raised
        return {**record, "built": False, "error": f"{type(err).__name__}: {err}"}
    record["built"] = True
    record["partitioned"] = all(hasattr(p, "ds_id") for p in model.parameters())
    record["derived_train_batch_size"] = DeepSpeedConfig(copy.deepcopy(filled)).train_batch_size
    record["ds_world_size"] = deepspeed.comm.get_world_size()
    return record


def probe(config: str, out: Path) -> dict:
    rank = int(os.environ["RANK"])
    generated = json.loads(Path(config).read_text())
    model_dir = out / f"model_rank{rank}"  # one per rank: no barrier exists before the process group
    load_model(None, seed=0).save_pretrained(model_dir)
    world = int(os.environ["WORLD_SIZE"])
    variants = {
        "auto": {**generated, "train_batch_size": "auto"},
        "number": {**generated, "train_batch_size": MICRO * ACCUM * world},
        "absent": generated,
        "auto_after_comm_up": {**generated, "train_batch_size": "auto"},
    }
    return {name: try_variant(variant, model_dir, out) for name, variant in variants.items()}


if __name__ == "__main__":
    run_rank(probe)

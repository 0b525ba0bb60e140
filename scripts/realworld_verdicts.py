"""Recompute the verdict of every config in tests/fixtures/realworld/ by running its consumer's own parse.

    .venv/bin/python -m scripts.realworld_verdicts

Consumers (the manifest's "consumer"):
- deepspeed: `deepspeed.initialize(config=PATH)`; DeepSpeed reads a path with hjson
  (deepspeed/runtime/config.py DeepSpeedConfig.__init__), then parses at the world size.
- hf-trainer: `TrainingArguments(deepspeed=PATH)`: transformers reads the file with strict `json`
  (integrations/deepspeed.py HfDeepSpeedConfig -> accelerate HfDeepSpeedConfig), accelerate's
  DeepSpeedPlugin checks it, HfTrainerDeepSpeedConfig fills "auto" (trainer_config_process and
  trainer_config_finalize) from TrainingArguments whose values match the config, then DeepSpeed parses.
- accelerate: `accelerate launch --deepspeed_config_file PATH`: DeepSpeedPlugin reads it (strict json),
  then what Accelerator._prepare_deepspeed fills on a GPU host (num_processes = world size), then DeepSpeed.
Exit 1 if any verdict differs from MANIFEST.json.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from zero_kit.lint.discover import deepspeed_parse

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "realworld"
HIDDEN_SIZE = 4096  # a LLaMA-7B-sized model fills the hidden-size "auto" keys
NUM_TRAINING_STEPS = 1000


def load_manifest() -> list[dict[str, Any]]:
    return json.loads((CORPUS / "MANIFEST.json").read_text())["configs"]


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def batch_values(config: dict, world_size: int) -> tuple[int, int]:
    """(micro batch, grad accumulation) a launch script would pass so that they match the config."""
    accum = _int_or(config.get("gradient_accumulation_steps"), 1)
    micro = config.get("train_micro_batch_size_per_gpu")
    total = config.get("train_batch_size")
    if not isinstance(micro, int) and isinstance(total, int) and total % (world_size * accum) == 0:
        micro = total // (world_size * accum)
    return _int_or(micro, 1), accum


def _enabled(config: dict, section: str) -> bool:
    return isinstance(config.get(section), dict) and config[section].get("enabled") is True


def training_arguments(config: dict, world_size: int) -> SimpleNamespace:
    """TrainingArguments' own defaults, with batch, precision and optimizer values matching the config."""
    from transformers import TrainingArguments

    fields = {f.name: f.default for f in dataclasses.fields(TrainingArguments) if f.init}
    micro, accum = batch_values(config, world_size)
    params = (config.get("optimizer") or {}).get("params") or {}
    clip = config.get("gradient_clipping")
    fields.update(
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        fp16=_enabled(config, "fp16"),
        bf16=_enabled(config, "bf16") or _enabled(config, "bfloat16"),
        max_grad_norm=clip if isinstance(clip, (int, float)) else fields["max_grad_norm"],
        learning_rate=params.get("lr") if isinstance(params.get("lr"), (int, float)) else fields["learning_rate"],
    )
    args = SimpleNamespace(**fields, world_size=world_size)
    args.get_warmup_steps = lambda steps: 0
    return args


def read_strict(path: Path) -> dict:
    """transformers and accelerate open the file with json.load (accelerate/utils/deepspeed.py HfDeepSpeedConfig)."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def hf_trainer_config(path: Path, world_size: int) -> dict:
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    config = read_strict(path)
    args = training_arguments(config, world_size)
    plugin = DeepSpeedPlugin(hf_ds_config=copy.deepcopy(config))
    hf_config = HfTrainerDeepSpeedConfig(plugin.deepspeed_config)
    hf_config.trainer_config_process(args)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=HIDDEN_SIZE))
    hf_config.trainer_config_finalize(args, model, NUM_TRAINING_STEPS)
    if "optimizer" not in hf_config.config:  # deepspeed_optim_sched: the Trainer's own optimizer
        hf_config.config["zero_allow_untested_optimizer"] = True
    return hf_config.config


def _precision(config: dict) -> str:
    return "bf16" if _enabled(config, "bf16") else "fp16" if _enabled(config, "fp16") else "no"


def accelerate_config(path: Path, world_size: int) -> dict:
    """DeepSpeedPlugin + Accelerator._prepare_deepspeed's fill, for prepare(model, optimizer, dataloader[, sched])."""
    from accelerate.utils import DeepSpeedPlugin

    config = read_strict(path)
    plugin = DeepSpeedPlugin(hf_ds_config=copy.deepcopy(config))
    plugin.set_mixed_precision(_precision(config))
    micro, _ = batch_values(config, world_size)
    if not plugin.is_auto("train_micro_batch_size_per_gpu"):
        micro = plugin.get_value("train_micro_batch_size_per_gpu")
    plugin.fill_match("gradient_accumulation_steps", must_match=False, gradient_accumulation_steps=1)
    kwargs: dict[str, Any] = {
        "gradient_clipping": 1.0,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
        "zero_optimization.reduce_bucket_size": HIDDEN_SIZE * HIDDEN_SIZE,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * HIDDEN_SIZE * HIDDEN_SIZE),
        "zero_optimization.stage3_param_persistence_threshold": 10 * HIDDEN_SIZE,
    }
    if micro is not None:
        kwargs["train_micro_batch_size_per_gpu"] = micro
        kwargs["train_batch_size"] = micro * plugin.get_value("gradient_accumulation_steps") * world_size
    if "optimizer" in plugin.deepspeed_config:  # DummyOptim(lr=1e-3, weight_decay=0)
        kwargs.update({"optimizer.params.lr": 1e-3, "optimizer.params.weight_decay": 0.0})
    else:
        plugin.deepspeed_config["zero_allow_untested_optimizer"] = True
    if "scheduler" in plugin.deepspeed_config:  # DummyScheduler(optimizer, total_num_steps, warmup_num_steps=0)
        kwargs.update(
            {
                "scheduler.params.warmup_min_lr": 0,
                "scheduler.params.warmup_max_lr": 1e-3,
                "scheduler.params.warmup_num_steps": 1,
                "scheduler.params.total_num_steps": NUM_TRAINING_STEPS,
            }
        )
    plugin.deepspeed_config_process(must_match=False, **kwargs)
    return plugin.deepspeed_config


def basic_optimizer_error(config: dict) -> str | None:
    """What DeepSpeedEngine._configure_basic_optimizer refuses before building the optimizer of the config.

    It runs only when the script passes no optimizer of its own (engine.py _configure_optimizer:
    `if client_optimizer is None`). It rejects optimizer.params.max_grad_norm, and a type outside
    DEEPSPEED_OPTIMIZERS falls through to `getattr(torch.optim, name)` (the 1-bit optimizers, removed).
    """
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    section = config.get("optimizer") or {}
    if "max_grad_norm" in (section.get("params") or {}):
        return "ValueError: 'max_grad_norm' is not supported as an optimizer parameter"
    name = section.get("type")
    if isinstance(name, str) and name.lower() not in DEEPSPEED_OPTIMIZERS and not hasattr(torch.optim, name):
        return f"AttributeError: module 'torch.optim' has no attribute '{name}'"
    return None


def deepspeed_error(path: Path, world_size: int, client_optimizer: bool) -> str | None:
    """deepspeed.initialize(config=PATH): DeepSpeed's parse (hjson for a path), then its optimizer build."""
    import hjson

    error = deepspeed_parse(str(path), world_size)
    if error or client_optimizer:
        return error
    with open(path, encoding="utf-8") as handle:
        return basic_optimizer_error(hjson.load(handle))


def consumer_error(path: Path, consumer: str, world_size: int, client_optimizer: bool = False) -> str | None:
    """The consumer's error for this file at this world size, or None if it accepts it."""
    try:
        if consumer == "deepspeed":
            return deepspeed_error(path, world_size, client_optimizer)
        builder = {"hf-trainer": hf_trainer_config, "accelerate": accelerate_config}[consumer]
        config = builder(path, world_size)
    except Exception as err:  # the consumers raise Value/Key/Type/JSONDecodeError alike
        return f"{type(err).__name__}: {err}".strip()
    return deepspeed_parse(config, world_size)


def check_all() -> list[dict[str, Any]]:
    """One row per manifest entry: path, expected verdict, computed verdict, error."""
    rows = []
    for entry in load_manifest():
        error = consumer_error(
            CORPUS / entry["path"], entry["consumer"], entry["world_size"], entry.get("client_optimizer", False)
        )
        verdict = "broken" if error else "works"
        rows.append({"path": entry["path"], "expected": entry["verdict"], "verdict": verdict, "error": error})
    return rows


def main() -> int:
    rows = check_all()
    for row in rows:
        mark = "  " if row["verdict"] == row["expected"] else "!!"
        first_line = (row["error"] or "").splitlines()[0][:90] if row["error"] else ""
        print(f"{mark} {row['verdict']:6} {row['path']:70} {first_line}")
    wrong = [row for row in rows if row["verdict"] != row["expected"]]
    print(f"{len(rows)} configs, {len(wrong)} disagree with MANIFEST.json")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

"""DeepSpeed's own parse as the linter's last word: whatever passes `lint` also passes `DeepSpeedConfig`."""

from __future__ import annotations

import copy
import functools

from zero_kit.lint.discover import deepspeed_parse
from zero_kit.lint.problem import BATCH_KEYS, ROOT, Problem, lookup


def check_with_deepspeed(config: dict, world_size: int, filled_autos: list[str]) -> list[Problem]:
    """DeepSpeed's own parse as the last word, at `world_size`, with the "auto" values that the
    target fills (`filled_autos`) taken out (and the batch triple made whole, as the Trainer would)."""
    clean = copy.deepcopy(config)
    for path in filled_autos:
        *parents, last = path.split(".")
        node = functools.reduce(lambda d, k: d.get(k, {}), parents, clean)
        node.pop(last, None)
    if any(k in filled_autos for k in BATCH_KEYS):
        # null is DeepSpeed's "not given" (its default): the Trainer fills it as it fills a missing key
        micro = clean["train_micro_batch_size_per_gpu"] = clean.get("train_micro_batch_size_per_gpu") or 1
        accum = clean["gradient_accumulation_steps"] = clean.get("gradient_accumulation_steps") or 1
        clean["train_batch_size"] = micro * accum * world_size
    message = deepspeed_parse(clean, world_size)
    if message is None:
        return []
    path = _path_named_in(config, message) or ROOT
    return [
        Problem(
            "error",
            path,
            lookup(config, path),
            f"DeepSpeed's own parser rejects the config: {message}",
            "fix the value DeepSpeed names",
        )
    ]


def _path_named_in(config: dict, message: str, prefix: str = "") -> str | None:
    """The deepest key path of `config` whose last key appears in DeepSpeed's message."""
    best = None
    for key, value in config.items():
        here = f"{prefix}.{key}" if prefix else key
        if isinstance(key, str) and key in message:
            best = here
        if isinstance(value, dict):
            best = _path_named_in(value, message, here) or best
    return best

"""The bottom of the linter: a `Problem` (one finding), the `LintContext` (what the config cannot tell), and
the key-path helpers every rule module shares. No rules here, and nothing above this module is imported."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from zero_kit.lint.script_args import TrainerArguments

Severity = Literal["error", "warning"]
Target = Literal["deepspeed", "hf-trainer", "accelerate"]
Device = Literal["cuda", "cpu"]
ROOT = "<config>"
"""Key path used for problems about the config as a whole."""
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass(frozen=True)
class Problem:
    """One finding: where (key path), what was found, why it is wrong, and what to do."""

    severity: Severity
    path: str
    value: Any
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        found = f" (found {_show(self.value)})"
        fix = f"\n    fix: {self.fix}" if self.fix else ""
        return f"{self.severity}: {self.path}{found}: {self.message}{fix}"


@dataclass(frozen=True)
class LintContext:
    """What the linter cannot read from the config itself."""

    world_size: int | None = None
    """Data-parallel ranks the config will run at (None: unknown, batch checks that need it are skipped)."""
    world_size_source: str = "--world-size"
    """Where the world size came from, named in messages (a flag or an environment variable)."""
    target: Target = "deepspeed"
    """Who consumes the config: plain deepspeed.initialize, the HF Trainer, or accelerate launch."""
    device: Device | None = None
    """What the run uses: cuda or cpu (None: unknown, CUDA-only features such as ZeRO++ qwZ/qgZ are not judged)."""
    ranks_per_node: int | None = None
    """Ranks (GPUs) per node (None: unknown; hpZ's node-locality check is skipped)."""
    trainer_args: TrainerArguments | None = None
    """The arguments of the user's own HF Trainer script (None: not given; the mismatch rules are skipped)."""
    accelerate_use_cpu: str | None = None
    """ACCELERATE_USE_CPU in the run's environment (None: unset)."""
    attention_heads: int | None = None
    """The model's attention heads (None: no model given; AutoTP's head checks are skipped)."""
    kv_heads: int | None = None
    """The model's key-value heads (grouped-query attention; equal to attention_heads without it)."""
    client_optimizer: bool | None = None
    """The script passes its own optimizer and scheduler to accelerate / deepspeed.initialize (None: unknown)."""
    script_cpu_adam: bool | None = None
    """The script builds DeepSpeedCPUAdam (None: the script was not read)."""
    script_process_group: bool | None = None
    """The script gives accelerate a process-group backend (None: the script was not read)."""


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else _json_like(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_like(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return repr(value)


def join(path: str, key: Any) -> str:
    """Dotted key path; list items and odd keys (empty, dots, spaces) in brackets: a.b[0]["x y"]."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_\-]+", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def did_you_mean(key: Any, choices: Any) -> str:
    """A "did you mean" fix for an unknown key, or a list of the valid ones."""
    import difflib

    choices = sorted({c for c in choices if isinstance(c, str)})
    match = difflib.get_close_matches(str(key), choices, n=1, cutoff=0.6)
    if match:
        return f"did you mean {match[0]!r}?"
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    return f"remove it, or use one of: {shown}"


def lookup(config: Any, path: str, default: Any = None) -> Any:
    """`config["a"]["b"]` for "a.b", or `default` when any level is missing or not a dict."""
    node = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

"""What a user's own training script does with its optimizer and its process group, read from its source
(`zero-kit validate --script FILE`), so the config is judged against the contract of the code that consumes it.

Read with `ast`, never run. What is looked for, and why each matters (rules_consumer):
- its own optimizer: `deepspeed.initialize(..., optimizer=...)` (third positional argument included), or
  `accelerator.prepare(...)` given a name that holds a `torch.optim` / DeepSpeed optimizer (or `optim` in its
  name). accelerate refuses a config optimizer beside it; DeepSpeed silently uses the script's instead.
  `deepspeed.initialize` without one uses the config's section.
- an HF Trainer (any class whose name ends in `Trainer`, TRL's included) and no own prepare/initialize: the Trainer
  handles the section itself either way.
- `DeepSpeedCPUAdam`: what DeepSpeed requires of a script's optimizer under ZeRO-Offload.
- `InitProcessGroupKwargs(backend=...)` handed to `Accelerator(kwargs_handlers=...)`: the one line that gives
  accelerate a process group on a CPU-only host.

A script whose calls are built dynamically reads as unknown (None), and the rules that need it stay quiet.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from zero_kit.errors import UserError

OPTIMIZER_NAMES = ("AdamW", "Adam", "SGD", "Adagrad", "Adafactor", "DeepSpeedCPUAdam", "FusedAdam", "Lion")


@dataclass(frozen=True)
class ScriptFacts:
    client_optimizer: bool | None = None
    """The script passes its own optimizer (and scheduler) to accelerate or deepspeed.initialize (None: unknown)."""
    cpu_adam: bool = False
    """It builds DeepSpeed's CPU Adam somewhere."""
    process_group_backend: bool = False
    """It gives accelerate a process-group backend (InitProcessGroupKwargs(backend=...))."""


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _optimizer_names(tree: ast.AST) -> set[str]:
    """Variables assigned an optimizer object: `opt = torch.optim.AdamW(...)`, `opt = (A if x else B)(...)`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            called = {_dotted(n).rsplit(".", 1)[-1] for n in ast.walk(node.value.func)}
            if called & set(OPTIMIZER_NAMES) or "optim" in _dotted(node.value.func).split("."):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def read_script(path: str) -> ScriptFacts:
    """The facts of `path` (a Python file); UserError naming the file and line when it cannot be read."""
    try:
        source = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(source, filename=path)
    except OSError as err:
        raise UserError(
            f"--script {path}: cannot read it ({err.strerror})", "pass your training script's path"
        ) from None
    except (SyntaxError, UnicodeDecodeError) as err:
        where = f" line {err.lineno}" if isinstance(err, SyntaxError) else ""
        raise UserError(f"--script {path}:{where} not Python ({err})", "pass the training script itself") from None
    optimizers = _optimizer_names(tree)
    client, trainer, cpu_adam, backend, handed = None, False, False, False, False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name | ast.Attribute) and _dotted(node).endswith("DeepSpeedCPUAdam"):
            cpu_adam = True
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        if name.endswith("deepspeed.initialize") or name == "initialize":
            given = any(k.arg == "optimizer" for k in node.keywords) or len(node.args) >= 3
            client = bool(client) or given
        elif last == "prepare" and "." in name:
            args = [_dotted(a) for a in node.args]
            if any(a in optimizers or "optim" in a.lower() for a in args):
                client = True
        elif last.endswith("Trainer") and last[:1].isupper():
            trainer = True
        elif last == "InitProcessGroupKwargs" and any(k.arg == "backend" for k in node.keywords):
            backend = True
        elif last == "Accelerator" and any(k.arg == "kwargs_handlers" for k in node.keywords):
            handed = True
    if client is None and trainer:
        client = False
    return ScriptFacts(client_optimizer=client, cpu_adam=cpu_adam, process_group_backend=backend and handed)

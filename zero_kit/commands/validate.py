"""`zero-kit validate FILE... [--for hf-trainer -- SCRIPT ARGS]`: lint DeepSpeed JSON configs before launch.

Exit 0: no errors (warnings may print); 1: errors; 2: unreadable input (missing file, invalid JSON).
The world size comes from --world-size, else WORLD_SIZE / SLURM_NTASKS / OMPI_COMM_WORLD_SIZE.
After `--`, the arguments of the user's own Trainer script: the config is judged against the TrainingArguments they
give (read by transformers' own parser), and as a run on this machine unless --device says otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

from zero_kit.commands.config import heads_from_model_dir
from zero_kit.errors import UserError
from zero_kit.options import add_dataclass_arguments

EXIT_OK, EXIT_ERRORS, EXIT_UNREADABLE = 0, 1, 2


@dataclass(frozen=True)
class ValidateOptions:
    world_size: int | None = None
    """Data-parallel ranks the config will run at. Default: WORLD_SIZE, SLURM_NTASKS or OMPI_COMM_WORLD_SIZE."""
    json: bool = False
    """Print the problems as a JSON list (each with file, severity, path, value, message, fix)."""
    device: Literal["cuda", "cpu"] | None = None
    """What the run uses: cpu refuses CUDA-only features (ZeRO++ qwZ/qgZ) and, with your script's arguments after
    --, adds the traps of a CPU run. Default: not judged; with script arguments, this machine (cpu without CUDA)."""
    gpus_per_node: int | None = None
    """Ranks per node, for ZeRO++ hpZ (its partition size should divide it). Default: not judged."""
    model: str | None = None
    """Local Hugging Face model directory: its attention and key-value heads (config.json) for the AutoTP rules
    (tensor_parallel.autotp_size). Default: not judged."""
    script: str | None = None
    """Your own training script (Python, read, not run): whether it passes its own optimizer and scheduler to
    accelerate or deepspeed.initialize, builds DeepSpeedCPUAdam, and gives accelerate a CPU process group. Judged
    against what that consumer does with the config's optimizer and scheduler sections."""
    accelerate_config: str | None = None
    """The `accelerate launch --config_file` YAML too: every key against what the installed accelerate reads (an
    unknown key, a deepspeed_config key it silently drops, one it refuses beside deepspeed_config_file)."""
    client_optimizer: bool | None = None
    """The script passes its own optimizer and scheduler (an own loop); --no-client-optimizer: it does not (an HF
    Trainer, or deepspeed.initialize with the config's optimizer). Default: from --script, else unknown."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="DeepSpeed JSON config(s) to check")
    parser.add_argument(
        "--for",
        dest="target",
        choices=("deepspeed", "hf-trainer", "accelerate"),
        default="deepspeed",
        help='who launches the config: plain deepspeed.initialize (no "auto"), the HF Trainer, or accelerate launch;'
        " with hf-trainer, the arguments after -- are your script's: fixed config values that disagree with the"
        " TrainingArguments they give are errors (the Trainer stops on them), as are the traps of a CPU run",
    )
    add_dataclass_arguments(parser, ValidateOptions)
    parser.set_defaults(script_args=None)  # cli.main hands over what follows `--`
    parser.epilog = "your own Trainer script: zero-kit validate ds.json --for hf-trainer -- ARGUMENTS OF YOUR SCRIPT"


def world_size_from(flag: int | None, environ: dict[str, str]) -> tuple[int | None, str]:
    """The world size and where it came from: the flag first, then the launcher's environment."""
    from zero_kit.dist import world_size_from_env

    if flag is not None:
        if flag < 1:
            raise UserError(f"--world-size must be >= 1, got {flag}", "pass the number of data-parallel ranks")
        return flag, "--world-size"
    try:
        return world_size_from_env(environ)
    except ValueError as err:
        raise UserError(str(err), "unset it or pass --world-size N") from None


def _lint_file(path: str, context) -> list[dict[str, Any]]:
    from zero_kit.lint import lint_file

    _, problems = lint_file(path, context)
    return [{"file": path, **p.to_dict()} for p in problems]


def _print_text(path: str, problems: list[dict[str, Any]]) -> None:
    from zero_kit.lint import Problem

    errors = sum(p["severity"] == "error" for p in problems)
    warnings = len(problems) - errors
    print(f"{path}: {'OK' if not errors else 'FAILED'} ({errors} error(s), {warnings} warning(s))")
    for item in problems:
        fields = {k: v for k, v in item.items() if k != "file"}
        print("  " + str(Problem(**fields)).replace("\n", "\n  "))


def _json_safe(value: Any) -> Any:
    """NaN/Infinity are not JSON: show them as strings in --json output."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return [_json_safe(v) for v in value] if isinstance(value, list) else value


UNREADABLE_FIX = "pass a readable DeepSpeed JSON config file (zero-kit config -o FILE writes one)"


def _note(text: str) -> None:
    print(f"zero-kit validate: note: {text}", file=sys.stderr)


def _device_here() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def script_arguments(args: argparse.Namespace) -> tuple[Any, str | None]:
    """The TrainingArguments of the user's script (after `--`) and the device the run is judged for; (None, --device)
    without script arguments. One note each for what is ignored or assumed."""
    if args.script_args is None:
        return None, args.device
    if args.target != "hf-trainer":
        raise UserError(
            f"arguments after -- are your HF Trainer script's, but --for is {args.target}",
            "add --for hf-trainer, or drop everything after --",
        )
    from zero_kit.lint.script_args import parse_trainer_arguments

    trainer_args, ignored, deepspeed_path = parse_trainer_arguments(args.script_args)
    if ignored:
        _note(f"not TrainingArguments, ignored (your script's own): {' '.join(ignored)}")
    if deepspeed_path is not None and all(os.path.abspath(deepspeed_path) != os.path.abspath(f) for f in args.files):
        _note(f"the script's --deepspeed {deepspeed_path} is not the file judged here")
    device = args.device or _device_here()
    if args.device is None:
        here = "no CUDA here" if device == "cpu" else "CUDA here"
        _note(f"judged as a {device} run ({here}); pass --device to judge a run elsewhere")
    return trainer_args, device


def _script_facts(args: argparse.Namespace):
    """What --script and --client-optimizer say the script does (the flag wins over the reading)."""
    from zero_kit.lint.own_script import ScriptFacts, read_script

    facts = read_script(args.script) if args.script else ScriptFacts()
    if args.client_optimizer is not None:
        facts = ScriptFacts(args.client_optimizer, facts.cpu_adam, facts.process_group_backend)
    elif args.script and facts.client_optimizer is None:
        _note(f"{args.script}: cannot tell whether it passes its own optimizer; pass --client-optimizer or"
              " --no-client-optimizer")  # fmt: skip
    return facts


def run(args: argparse.Namespace) -> int:
    from zero_kit.lint import LintContext, Unreadable

    world_size, source = world_size_from(args.world_size, dict(os.environ))
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UserError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}", "pass the GPUs of one node")
    trainer_args, device = script_arguments(args)
    facts = _script_facts(args)
    accelerate_config = _read_accelerate_config(args.accelerate_config)  # every input read before any report
    if facts.client_optimizer is not None and device is None and args.target == "accelerate":
        device = _device_here()  # an own loop's CPU trap depends on the machine it runs on
        _note(f"judged as a {device} run ({'no CUDA' if device == 'cpu' else 'CUDA'} here); pass --device otherwise")
    heads = heads_from_model_dir(args.model)
    context = LintContext(
        attention_heads=heads[0] if heads else None,
        kv_heads=heads[1] if heads else None,
        world_size=world_size,
        world_size_source=source,
        target=args.target,
        device=device,
        ranks_per_node=args.gpus_per_node,
        trainer_args=trainer_args,
        accelerate_use_cpu=os.environ.get("ACCELERATE_USE_CPU"),
        client_optimizer=facts.client_optimizer,
        script_cpu_adam=facts.cpu_adam if args.script else None,
        script_process_group=facts.process_group_backend if args.script else None,
    )
    everything: list[dict[str, Any]] = []
    worst = EXIT_OK
    for path in args.files:
        try:
            problems = _lint_file(path, context)
        except Unreadable as err:
            print(f"zero-kit validate: error: {err.where(path)}: {err}\n  fix: {UNREADABLE_FIX}", file=sys.stderr)
            everything.append(
                {"file": path, "severity": "error", "line": err.line, "column": err.column, "message": str(err)}
            )
            worst = EXIT_UNREADABLE
            continue
        if any(p["severity"] == "error" for p in problems):
            worst = max(worst, EXIT_ERRORS)
        everything += problems
        if not args.json:
            _print_text(path, problems)
    if accelerate_config is not None:
        worst = max(worst, _check_accelerate_config(args, accelerate_config, everything))
    if args.json:
        print(json.dumps(_json_safe(everything), indent=2, default=str))
    return worst


def _read_accelerate_config(path: str | None) -> dict | None:
    from zero_kit.lint.accelerate_yaml import read_yaml

    return read_yaml(path) if path else None


def _check_accelerate_config(args: argparse.Namespace, data: dict, everything: list[dict[str, Any]]) -> int:
    from zero_kit.lint.accelerate_yaml import check_accelerate_yaml

    path = args.accelerate_config
    found, notes = check_accelerate_yaml(data, args.files)
    for note in notes:
        _note(f"{path}: {note}")
    problems = [{"file": path, **p.to_dict()} for p in found]
    everything += problems
    if not args.json:
        _print_text(path, problems)
    return EXIT_ERRORS if any(p.severity == "error" for p in found) else EXIT_OK

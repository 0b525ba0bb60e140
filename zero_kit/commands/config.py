"""`zero-kit config`: write a DeepSpeed JSON for ZeRO stage 0-3. Quick: imports neither torch nor deepspeed."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from zero_kit.config.builder import RunAdjustments, accelerate_yaml, dumps, generate, resolve_world_size
from zero_kit.config.spec import ZeroSpec
from zero_kit.errors import UserError, check_writable_file, refuse_overwrite, write_text
from zero_kit.options import add_dataclass_arguments, dataclass_from_args

HIDDEN_SIZE_KEYS = ("hidden_size", "n_embd", "d_model")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, ZeroSpec)
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="local Hugging Face model directory: hidden size (and, with --tp or --sp, the attention heads) from its"
        " config.json",
    )
    parser.add_argument(
        "--accelerate-yaml",
        metavar="FILE",
        help="also write an `accelerate launch --config_file` YAML pointing at the JSON (needs -o; micro batch and"
        " grad accum are written as numbers, train_batch_size is left out: DeepSpeed derives it at launch); with --sp,"
        " also accelerate's parallelism_config (sp_backend deepspeed, sp_size, attention sdpa)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write the JSON here instead of stdout")
    parser.add_argument(
        "--force", action="store_true", help="let -o replace a file that is not a DeepSpeed JSON zero-kit wrote"
    )


def _model_config(model_dir: str) -> tuple[Path, dict]:
    """`model_dir/config.json` (its text_config for a multimodal model), with errors that name the file."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UserError(
            f"--model {model_dir}: no config.json in that directory", "point --model at a Hugging Face model dir"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: cannot read it as JSON ({err})", "fix or replace the model's config.json") from None
    config = config.get("text_config", config) if isinstance(config, dict) else config
    return path, config if isinstance(config, dict) else {}


def hidden_size_from_model_dir(model_dir: str) -> int:
    """The hidden size in `model_dir/config.json`, with errors that name the file."""
    path, config = _model_config(model_dir)
    for key in HIDDEN_SIZE_KEYS:
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    raise UserError(f"{path}: no positive integer {' / '.join(HIDDEN_SIZE_KEYS)}", "pass --hidden-size H instead")


def heads_from_model_dir(model_dir: str | None) -> tuple[int, int] | None:
    """(attention heads, key-value heads) from `model_dir/config.json` for the AutoTP and Ulysses head rules; None
    when the directory or the keys are missing (the rules that need them are then skipped, as in `zero-kit
    validate`)."""
    if not model_dir:
        return None
    _, config = _model_config(model_dir)
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads") or heads
    valid = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, kv))
    return (heads, kv) if valid else None


def spec_from_args(args: argparse.Namespace) -> ZeroSpec:
    if args.model and args.hidden_size is not None:
        raise UserError("--model and --hidden-size both given", "give one: the hidden size is read from --model")
    spec = dataclass_from_args(ZeroSpec, args)
    if args.model:
        spec = dataclasses.replace(spec, hidden_size=hidden_size_from_model_dir(args.model))
    if args.accelerate_yaml:
        if not args.output:
            raise UserError(
                "--accelerate-yaml needs -o FILE", "the YAML points at the JSON file, so write the JSON too"
            )
        # accelerate fills batch sizes for one process only (see shared/recipes): pin them to numbers.
        world = resolve_world_size(spec.world_size, spec.nodes, spec.gpus_per_node)
        # accelerate refuses a config optimizer beside a loop's own; the Trainer builds its own without one.
        client = True if spec.client_optimizer is None else spec.client_optimizer
        spec = dataclasses.replace(spec, world_size=world, nodes=None, gpus_per_node=None,
                                   micro_batch=spec.micro_batch or 1, client_optimizer=client)  # fmt: skip
    return spec


def written_by_zero_kit(path: Path) -> bool:
    """The mark of a DeepSpeed JSON that `config -o` or `plan -o` wrote: a JSON object with zero_optimization,
    in exactly the bytes `dumps` gives for it (sorted keys, two-space indent, final newline). A hand-written or
    hand-edited config almost never is, so it is kept unless --force."""
    try:
        text = path.read_text(encoding="utf-8")
        config = json.loads(text)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "zero_optimization" in config and dumps(config) == text


def check_output(path: str, flag: str, force: bool) -> None:
    """Before any work: `path` can be written, and holds nothing zero-kit did not write (unless --force)."""
    check_writable_file(path, flag)
    refuse_overwrite(path, flag, force, written_by_zero_kit)


def write_config(path: str, text: str, flag: str, force: bool) -> None:
    """Write a generated config to `path`, unless a file there holds another one and no --force: the same bytes are
    kept as they are, and a config edited by hand (or made with other flags) is never replaced silently."""
    try:
        there = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        there = None
    if there == text:
        return
    if there is not None and not force:
        raise UserError(
            f"{flag} {path}: holds a config other than the one this command writes (edited by hand, or made with "
            "other flags); not overwriting it",
            f"pass --force to replace it, or choose another {flag}",
        )
    write_text(path, text, flag)


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    if args.output:
        check_output(args.output, "-o", args.force)
    if args.accelerate_yaml:
        check_writable_file(args.accelerate_yaml, "--accelerate-yaml")
    # accelerate (and the Trainer under it) builds a ZeRO-3 model before DeepSpeed counts the ranks: no global batch.
    heads = heads_from_model_dir(args.model) if spec.tp > 1 or spec.sp > 1 else None
    generated = generate(spec, RunAdjustments(global_batch_key=not args.accelerate_yaml), heads)
    for warning in generated.warnings:  # the linter's warnings, as `zero-kit validate` gives them for the JSON
        print(f"zero-kit config: warning: {warning}", file=sys.stderr)
    text = dumps(generated.config)
    if not args.output:
        sys.stdout.write(text)
        return 0
    write_config(args.output, text, "-o", args.force)
    if args.accelerate_yaml:
        nodes = args.nodes or 1
        path = str(Path(args.output).resolve())
        yaml = accelerate_yaml(path, spec.world_size, nodes, zero3_init=spec.stage == 3, sp=spec.sp)
        write_text(args.accelerate_yaml, yaml, "--accelerate-yaml")
    return 0

"""The model's files and modules, checked in the starting process before any rank loads them (issue 52): a model
directory without its weights, a shard its index lists that is not there (or was cut short), and a --lora-targets
name that matches no module were found only by every rank after its imports, each saying it again beside
DeepSpeed's errors, and a target with a typo beside a right one (`q_proj,qkv_projj`) passed without a word.

Read without torch: the weights a directory holds are looked up in the order transformers takes them
(model.safetensors, its index, pytorch_model.bin, its index), and the modules' names come from the weights' own
names (a safetensors header is JSON; an index maps every name to its shard). The embedded tiny model has no files:
its names are pinned here (EMBEDDED_LAYER, tests/unit/test_model_files.py holds them to what transformers builds).
Only a lone pytorch_model.bin (a pickle) leaves the names to a model built on the meta device (no memory, no
weights)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from zero_kit.errors import UserError, raise_all
from zero_kit.model import TINY_DEFAULTS, lora_target_modules
from zero_kit.train.options import TrainOptions

SAFETENSORS, BIN = "model.safetensors", "pytorch_model.bin"
WEIGHT_FILES = (SAFETENSORS, f"{SAFETENSORS}.index.json", BIN, f"{BIN}.index.json")
"""What transformers loads a model's weights from, in the order it looks."""
EMBEDDED_LAYER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")  # fmt: skip
"""The modules with weights in each decoder layer of the embedded tiny LLaMA (LlamaDecoderLayer)."""
FIX_FILES = "pass the directory save_pretrained wrote, whole (or download the model again: `hf download ORG/NAME`)"


def check_model_files(opts: TrainOptions, model_dir: Path | None) -> None:
    """The weights of `model_dir` (the directory the ranks load: a Hub id's snapshot; None: the embedded model) and,
    with --lora-r, that every --lora-targets name matches a module; every problem at once."""
    problems: list[UserError] = []
    names: list[str] | None = embedded_module_names() if model_dir is None else None
    if model_dir is not None:
        try:
            names = weight_names(model_dir)
        except UserError as err:
            problems.append(err)
    if names is not None and "lm_head" not in names:  # tied to the embeddings it has no file entry, yet is a module
        names.append("lm_head")
    if opts.lora_r is not None and (names is not None or not problems):
        try:
            check_lora_targets(opts.lora_targets, model_dir, names)
        except UserError as err:
            problems.append(err)
    raise_all(problems, "in --model's files")


def embedded_module_names() -> list[str]:
    """The modules with weights of the embedded tiny LLaMA, by their full names."""
    layers = [f"model.layers.{i}.{name}" for i in range(TINY_DEFAULTS["num_hidden_layers"]) for name in EMBEDDED_LAYER]
    return ["model.embed_tokens", *layers, "model.norm", "lm_head"]


def weight_names(model_dir: Path) -> list[str] | None:
    """The modules that own weights in `model_dir` (from the weights' names), or None when only a pickle holds
    them; a UserError naming the file when the weights are missing, a listed shard is not there, or a safetensors
    file is cut short."""
    for name in WEIGHT_FILES:
        path = model_dir / name
        if not path.is_file():
            continue
        if name == SAFETENSORS:
            return _owners(_safetensors_names(path))
        if name == BIN:
            return None
        shards = _index_shards(path)
        missing = sorted({shard for shard in shards.values() if not (model_dir / shard).is_file()})
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise UserError(f"--model {model_dir}: {name} lists {len(missing)} shard(s) that are not there: {shown}",
                            FIX_FILES)  # fmt: skip
        for shard in sorted(set(shards.values())) if name.startswith(SAFETENSORS) else ():
            _safetensors_names(model_dir / shard)  # each one whole
        return _owners(list(shards))
    raise UserError(f"--model {model_dir}: no weights in it (none of {', '.join(WEIGHT_FILES)})", FIX_FILES)


def _owners(parameter_names: list[str]) -> list[str]:
    """`model.layers.0.self_attn.q_proj.weight` -> `model.layers.0.self_attn.q_proj`, in order, once each."""
    return list(dict.fromkeys(name.rpartition(".")[0] for name in parameter_names if "." in name))


def _index_shards(path: Path) -> dict[str, str]:
    """An index's weight_map: parameter name -> shard file."""
    try:
        shards = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"--model {path}: not a weights index ({type(err).__name__}: {err})", FIX_FILES) from None
    if not isinstance(shards, dict) or not all(isinstance(v, str) for v in shards.values()):
        raise UserError(f"--model {path}: its weight_map is not a mapping of names to files", FIX_FILES)
    return shards


def _safetensors_names(path: Path) -> list[str]:
    """The tensor names of a safetensors file, from its header (8 bytes of length, then JSON), once the file is
    as long as its header says (a download cut short is said here, not by each rank)."""
    try:
        with open(path, "rb") as file:
            length = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(length)) if 0 < length < 2**27 else None
        size = path.stat().st_size
    except (OSError, ValueError) as err:
        raise UserError(f"--model {path}: not a readable safetensors file ({err})", FIX_FILES) from None
    if not isinstance(header, dict):
        raise UserError(f"--model {path}: not a safetensors file (no header)", FIX_FILES)
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    try:
        end = max((int(info["data_offsets"][1]) for info in tensors.values()), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        raise UserError(f"--model {path}: a safetensors header without data offsets", FIX_FILES) from None
    if size < 8 + length + end:
        raise UserError(f"--model {path}: cut short ({size:,} bytes of {8 + length + end:,})", FIX_FILES)
    return list(tensors)


def check_lora_targets(lora_targets: str | None, model_dir: Path | None, names: list[str] | None) -> None:
    """Every --lora-targets name matches a module as peft matches a list of targets (the full name, or its end
    after a dot); one that matches none is refused with the names the model's layers have. names: the modules
    with weights (None: built on the meta device from model_dir's config)."""
    model_type = _model_type(model_dir)
    targets = lora_target_modules(lora_targets, model_type)
    modules = names if names is not None else _meta_module_names(model_dir)
    unmatched = [t for t in targets if not any(m == t or m.endswith("." + t) for m in modules)]
    if not unmatched:
        return
    leaves = list(dict.fromkeys(m.rpartition(".")[2] for m in modules))
    close = [(t, difflib.get_close_matches(t.rpartition(".")[2], leaves, n=1)) for t in unmatched]
    hints = "".join(f"did you mean {found[0]} (not {t})? " for t, found in close if found)
    which = "--lora-targets " + ",".join(targets) if lora_targets is not None else "the default LoRA targets"
    raise UserError(
        f"{which}: no module of the model is named {', '.join(unmatched)} (its layers with weights:"
        f" {', '.join(leaves)})",
        f"{hints}name modules the model has, or leave --lora-targets out for the family's attention projections",
    )


def _model_type(model_dir: Path | None) -> str | None:
    if model_dir is None:
        return "llama"
    try:
        return json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None  # the config checks say what is wrong with it


def _meta_module_names(model_dir: Path | None) -> list[str]:
    """The modules with weights of the model built from `model_dir`'s config on the meta device: no memory, no
    weights read (only where no file lists the names: a lone pytorch_model.bin)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return _owners([name for name, _ in model.named_parameters()])

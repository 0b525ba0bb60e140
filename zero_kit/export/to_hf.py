"""ZeRO checkpoint -> plain Hugging Face directory (safetensors + config + tokenizer), or a peft LoRA adapter.

Streams: export_read finds where each trained parameter lies in the ranks' optimizer shards without reading them
(weights_only: a checkpoint is data, never code), and export_write writes each output shard a tensor at a time,
fp32 parameters copied file to file; host memory stays near the largest tensor, whatever the model or shard size.
Every tensor's shape is checked against the model config before the first byte is written.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Iterator
from pathlib import Path

from zero_kit.errors import UserError
from zero_kit.export.checks import check_export
from zero_kit.export.reader import read_zero_checkpoint
from zero_kit.export.writer import write_shard

PEFT_PREFIX = "base_model.model."
DTYPES = ("fp32", "bf16", "fp16")


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (getrusage ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def export_checkpoint(
    checkpoint_dir: Path,
    out_dir: Path,
    *,
    merge: bool = False,
    dtype: str = "fp32",
    max_shard_mib: int = 1024,
    trust_remote_code: bool = False,
    force: bool = False,
) -> Path:
    """Write `out_dir` from a complete `checkpoint-N` written by `zero-kit train`; returns `out_dir`. The run's
    --model is loaded as data: code of its directory (auto_map) runs only with trust_remote_code, whatever the
    run's own record says (a record in a checkpoint is no one's consent)."""
    checkpoint_dir = Path(checkpoint_dir)
    info = check_export(checkpoint_dir, out_dir, force=force, trust_remote_code=trust_remote_code)
    options = info["options"]
    from zero_kit import model as zk_model

    lazy = read_zero_checkpoint(checkpoint_dir)
    config = zk_model.build_config(options.get("model"), trust_remote_code=trust_remote_code)
    if options.get("lora_r") is None:
        _write_model(_full_tensors(lazy), config, out_dir, dtype, max_shard_mib)
    elif merge:
        merged = _merged_tensors(_base_tensors(options), lazy, _lora_scale(options))
        _write_model(merged, config, out_dir, dtype, max_shard_mib)
    else:
        _write_adapter(lazy, options, config, out_dir, dtype, max_shard_mib)
    zk_model.load_tokenizer(options.get("model"), trust_remote_code=trust_remote_code).save_pretrained(out_dir)
    return out_dir


def _materialize(lazy_tensor):
    return lazy_tensor.contiguous()


def _full_tensors(lazy: dict) -> Iterator[tuple[str, object]]:
    for name in list(lazy):
        yield name, lazy.pop(name)


def _lora_scale(options: dict) -> float:
    alpha = options.get("lora_alpha")
    r = options["lora_r"]
    return (alpha if alpha is not None else 2 * r) / r


def _merged_tensors(base: dict, lazy: dict, scale: float) -> Iterator[tuple[str, object]]:
    """Base weights with W + scale * B @ A folded in wherever the run had an adapter."""
    for name, tensor in base.items():
        stem = PEFT_PREFIX + name.removesuffix(".weight")
        lora_a, lora_b = lazy.get(f"{stem}.lora_A.default.weight"), lazy.get(f"{stem}.lora_B.default.weight")
        yield name, tensor if lora_a is None else _LazyMerge(tensor, lora_a, lora_b, scale)


def _base_tensors(options: dict) -> dict:
    """The frozen base weights, which the Trainer leaves out of LoRA checkpoints (exclude_frozen_parameters):
    lazily from the model directory's safetensors, or rebuilt from the seed for the embedded tiny default
    (its construction is deterministic, under ZeRO-3 init too)."""
    model_dir = options.get("model")
    if model_dir is None:
        import torch

        from zero_kit import model as zk_model

        return zk_model.load_model(None, dtype=torch.float32, seed=options.get("seed", 0)).state_dict()
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise UserError(f"--model {model_dir}: no *.safetensors files for the LoRA base", "convert the base first")
    return {name: lazy for path in files for name, lazy in _safetensors_lazy(path).items()}


class _SafeLazy:
    """One tensor of a safetensors file, read only when its output shard is written."""

    def __init__(self, path: Path, name: str, shape):
        import torch

        self.path, self.name, self.shape, self.dtype = path, name, tuple(shape), torch.float32

    def contiguous(self):
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            return handle.get_tensor(self.name).float()


def _safetensors_lazy(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return {name: _SafeLazy(path, name, handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118 (not a dict)


class _LazyMerge:
    """W + scale * B @ A, computed only when its shard is written (keeps --merge streaming)."""

    def __init__(self, base, lora_a, lora_b, scale: float):
        self.shape, self._parts, self._scale, self.dtype = base.shape, (base, lora_a, lora_b), scale, base.dtype

    def contiguous(self):
        base, lora_a, lora_b = (_materialize(part) for part in self._parts)
        return base + self._scale * (lora_b @ lora_a)


def _expected_shapes(config) -> dict[str, tuple[int, ...]]:
    import torch
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    # The class itself, not from_config: inside a ZeRO-3 run (the end-of-training export) from_config would
    # enter deepspeed.zero.Init and start collectives on rank 0 alone. Meta tensors: shapes only, no memory.
    with torch.device("meta"):
        skeleton = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)](config)
    return {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}


def _write_model(tensors: Iterator, config, out_dir: Path, dtype: str, max_shard_mib: int) -> None:
    expected = _expected_shapes(config)
    plan = _plan_shards(list(tensors), expected, dtype, max_shard_mib * 2**20)
    _write_shards(plan, out_dir, "model", expected)
    config.save_pretrained(out_dir)
    _generation_config(config).save_pretrained(out_dir)


def _generation_config(config):
    from transformers import GenerationConfig

    return GenerationConfig.from_model_config(config)


def _plan_shards(named: list, expected: dict | None, dtype: str, max_bytes: int) -> list[list]:
    """Group (name, lazy tensor) pairs into shards of at most `max_bytes` (sizes from shapes, nothing loaded)."""
    _check_layout(named, expected)
    import torch

    wanted = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    shards: list[list] = [[]]
    size = 0
    for name, lazy in named:
        out_dtype = wanted if lazy.dtype.is_floating_point else lazy.dtype
        nbytes = _numel(lazy.shape) * out_dtype.itemsize
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, lazy, out_dtype))
        size += nbytes
    return shards


def _numel(shape) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def _check_layout(named: list, expected: dict | None) -> None:
    """Every tensor has the shape the model config gives it, before the first byte is written (a ZeRO-3 export must
    never write an empty or mis-shaped tensor)."""
    for name, lazy in named:
        shape = tuple(int(dim) for dim in lazy.shape)
        want = expected.get(name, shape) if expected is not None else shape
        if _numel(shape) == 0 or shape != want:
            raise UserError(f"export: tensor {name} has shape {shape}, expected {want}", "the checkpoint is damaged")
    if expected is None:
        return
    got = {name for name, _ in named}
    missing = sorted(set(expected) - got)
    # Rotary inv_freq and similar non-persistent buffers are not in the skeleton's state_dict.
    unexpected = sorted(got - set(expected))
    if missing or unexpected:
        raise UserError(
            f"checkpoint does not match the model config: missing {missing[:5]}, unexpected {unexpected[:5]}",
            "export with the same --model the run was trained with",
        )


def _write_shards(plan: list[list], out_dir: Path, stem: str, expected: dict | None) -> None:
    count = len(plan)
    weight_map = {}
    for index, shard in enumerate(plan, start=1):
        filename = f"{stem}.safetensors" if count == 1 else f"{stem}-{index:05d}-of-{count:05d}.safetensors"
        write_shard(out_dir / filename, shard, lambda name, lazy, dtype: _convert(name, lazy, dtype, expected))
        weight_map.update(dict.fromkeys((name for name, _, _ in shard), filename))
    if count > 1:
        index_file = {"metadata": {}, "weight_map": weight_map}
        (out_dir / f"{stem}.safetensors.index.json").write_text(json.dumps(index_file, indent=2) + "\n")


def _convert(name: str, lazy, dtype, expected: dict | None):
    tensor = _materialize(lazy)
    shape = tuple(tensor.shape)
    want = expected.get(name, shape) if expected is not None else shape
    if tensor.numel() == 0 or shape != want:
        raise UserError(f"export: tensor {name} has shape {shape}, expected {want}", "the checkpoint is damaged")
    return tensor.to(dtype).contiguous()


def _write_adapter(lazy: dict, options: dict, config, out_dir: Path, dtype: str, max_shard_mib: int) -> None:
    """peft adapter dir (adapter_config.json + adapter_model.safetensors); for the embedded default model,
    whose base exists nowhere on disk, the base weights go to OUT/base and the adapter points there."""
    from peft import LoraConfig

    adapter = [(n.replace(".default.", "."), lazy[n]) for n in lazy if ".lora_" in n]
    base_dir = Path(options["model"]).resolve() if options.get("model") else (out_dir / "base").resolve()
    if not options.get("model"):
        base_dir.mkdir(parents=True, exist_ok=True)
        _write_model(iter(_base_tensors(options).items()), config, base_dir, dtype, max_shard_mib)
    _write_shards(_plan_shards(adapter, None, dtype, 2**62), out_dir, "adapter_model", None)
    r = options["lora_r"]
    from zero_kit.model import lora_target_modules

    targets = lora_target_modules(options.get("lora_targets"), config.model_type)
    alpha = options.get("lora_alpha") if options.get("lora_alpha") is not None else 2 * r
    lora = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=options.get("lora_dropout", 0.0), target_modules=targets)
    lora.base_model_name_or_path = str(base_dir)
    lora.task_type = "CAUSAL_LM"
    lora.save_pretrained(str(out_dir))


def describe(out_dir: Path) -> str:
    files = sorted(p.name for p in out_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    size = sum((out_dir / f).stat().st_size for f in files if f.endswith(".safetensors"))
    return f"{out_dir} ({len(files)} files, {size / 2**20:.1f} MiB of safetensors)"

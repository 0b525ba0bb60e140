"""ZeRO checkpoint -> plain Hugging Face directory (safetensors + config + tokenizer), or a peft LoRA adapter.

Streams: DeepSpeed's `get_fp32_state_dict_from_zero_checkpoint(lazy_mode=True)` maps the optimizer shards
(torch.load mmap, made weights_only here: a checkpoint is data, never code) and hands back lazy tensors; we
materialize one output shard at a time, write it, and drop it, so host memory stays near the largest shard rather than the whole model. Every tensor's shape is
checked against the model config (a ZeRO-3 export must never write an empty or mis-shaped tensor).
"""

from __future__ import annotations

import contextlib
import json
import resource
from collections.abc import Iterator
from pathlib import Path

from zero_kit.errors import UserError
from zero_kit.train.export_checks import check_export

PEFT_PREFIX = "base_model.model."
DTYPES = ("fp32", "bf16", "fp16")


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (getrusage ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class AnonPeak:
    """Peak anonymous RSS (RssAnon in /proc/self/status, sampled every 5 ms in a thread) while in the block.

    ru_maxrss also counts the page cache of the mmapped ZeRO shards, which the kernel can drop at will;
    anonymous memory is what the export really holds. Linux only (0 elsewhere)."""

    def __enter__(self) -> AnonPeak:
        import threading

        self.peak_mib = self.start_mib = _rss_anon_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak_mib = max(self.peak_mib, _rss_anon_mib())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mib = max(self.peak_mib, _rss_anon_mib())


def _rss_anon_mib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


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

    lazy = _lazy_state_dict(checkpoint_dir)
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


def _lazy_state_dict(checkpoint_dir: Path) -> dict:
    import io

    import deepspeed.utils.zero_to_fp32 as zero_to_fp32

    # zero_to_fp32 prints progress to stdout; keep the command's own output readable.
    try:
        with contextlib.redirect_stdout(io.StringIO()), _weights_only_loads(zero_to_fp32):
            return zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), lazy_mode=True)
    except (ValueError, FileNotFoundError) as err:  # no `latest`, missing rank shards, not a ZeRO checkpoint
        raise UserError(
            f"{checkpoint_dir}: cannot read the ZeRO shards ({err})", "export a checkpoint-N of ZeRO stage 1-3"
        ) from err
    except _unpickling_error() as err:
        import re

        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f"({found.group(1)})" if found else f"({str(err).splitlines()[0]})"
        raise UserError(
            f"{checkpoint_dir}: a ZeRO shard holds an object that is not plain data {what}; export reads shards "
            "with torch.load(weights_only=True) and never runs code a checkpoint carries",
            "export a checkpoint written by zero-kit train with this DeepSpeed version",
        ) from None


# The classes DeepSpeed itself pickles into ZeRO checkpoints (loss scaler, fragment addresses, the stage enum):
# plain records, allowed by name; any other global in a shard is refused instead of being imported and called.
SAFE_DEEPSPEED_GLOBALS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
)


def _unpickling_error() -> type[Exception]:
    import pickle

    return pickle.UnpicklingError


@contextlib.contextmanager
def _weights_only_loads(module) -> Iterator[None]:
    """Inside: `module`'s torch.load (zero_to_fp32 asks for weights_only=False) reads with weights_only=True and
    DeepSpeed's own record classes allowed, so a planted pickle in a checkpoint cannot run code."""
    import importlib

    import torch

    allowed = []
    for dotted in SAFE_DEEPSPEED_GLOBALS:
        owner, _, name = dotted.rpartition(".")
        with contextlib.suppress(ImportError, AttributeError):  # a DeepSpeed without one of them never wrote it
            allowed.append(getattr(importlib.import_module(owner), name))

    class _Torch:
        def __getattr__(self, attr):
            return getattr(torch, attr)

        @staticmethod
        def load(*args, **kwargs):
            with torch.serialization.safe_globals(allowed):
                return torch.load(*args, **{**kwargs, "weights_only": True})

    original = module.torch
    module.torch = _Torch()
    try:
        yield
    finally:
        module.torch = original


def _materialize(lazy_tensor):
    import torch

    tensor = lazy_tensor.contiguous()
    # zero-1/2 hand back views into the mmapped flat partition: clone so the shard owns its memory.
    return tensor.clone() if isinstance(lazy_tensor, torch.Tensor) and tensor is lazy_tensor else tensor


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
        self.path, self.name, self.shape = path, name, tuple(shape)

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
        self.shape, self._parts, self._scale = base.shape, (base, lora_a, lora_b), scale

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
    if expected is not None:
        _check_names(named, expected)
    itemsize = 4 if dtype == "fp32" else 2
    shards: list[list] = [[]]
    size = 0
    for name, lazy in named:
        nbytes = _numel(lazy.shape) * itemsize
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, lazy, dtype))
        size += nbytes
    return shards


def _numel(shape) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def _check_names(named: list, expected: dict) -> None:
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
    from safetensors.torch import save_file

    count = len(plan)
    weight_map = {}
    for index, shard in enumerate(plan, start=1):
        filename = f"{stem}.safetensors" if count == 1 else f"{stem}-{index:05d}-of-{count:05d}.safetensors"
        tensors = {name: _convert(name, lazy, dtype, expected) for name, lazy, dtype in shard}
        save_file(tensors, str(out_dir / filename), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, filename))
        del tensors  # the shard is on disk: free it before materializing the next one
    if count > 1:
        index_file = {"metadata": {}, "weight_map": weight_map}
        (out_dir / f"{stem}.safetensors.index.json").write_text(json.dumps(index_file, indent=2) + "\n")


def _convert(name: str, lazy, dtype: str, expected: dict | None):
    import torch

    tensor = _materialize(lazy)
    shape = tuple(tensor.shape)
    want = expected.get(name, shape) if expected is not None else shape
    if tensor.numel() == 0 or shape != want:
        raise UserError(f"export: tensor {name} has shape {shape}, expected {want}", "the checkpoint is damaged")
    if tensor.is_floating_point():
        tensor = tensor.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    return tensor.contiguous()


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

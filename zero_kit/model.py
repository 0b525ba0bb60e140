"""LLaMA-style models: the embedded tiny default (built from a config, nothing downloaded) and local HF checkpoints.

    tokenizer = load_tokenizer(None)          # the tokenizer shipped in zero_kit/assets/tokenizer
    model = load_model(None, seed=0)          # tiny LlamaForCausalLM, ~3M parameters, same weights for a seed

With a transformers `HfDeepSpeedConfig` for ZeRO-3 alive (created by the caller, e.g. zero_kit.train.rank),
`from_config` / `from_pretrained` build the model inside `deepspeed.zero.Init`, so each rank allocates only
its partition of every parameter (`p.ds_numel` is the full size, `p.numel()` the local one).
"""

from __future__ import annotations

import json
import os
import zlib
from contextlib import contextmanager, nullcontext
from pathlib import Path

from zero_kit.errors import UserError

TINY_DEFAULTS = dict(
    hidden_size=192,
    intermediate_size=512,
    num_hidden_layers=6,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
TINY_VOCAB = 1823
"""The embedded tokenizer's size, the embedded model's vocabulary: read without loading the tokenizer (a run's plan is
made before torch or transformers is imported); tests/unit/test_train_run.py checks it against the tokenizer."""
# The same families as plan.shapes.SUPPORTED_MODEL_TYPES (tests/unit/test_families.py keeps them equal).
LLAMA_STYLE_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
# LoRA's default targets: the attention projections, as each family names them (Phi-3 fuses q, k, v in qkv_proj).
DEFAULT_LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj"
FAMILY_LORA_TARGETS = {"phi3": "qkv_proj,o_proj"}
ASSET_TOKENIZER = Path(__file__).resolve().parent / "assets" / "tokenizer"
# The files whose `auto_map` makes transformers import Python files of the directory (trust_remote_code).
REMOTE_CODE_CONFIGS = ("config.json", "tokenizer_config.json")
# Everything transformers raises for a directory it cannot read (missing/corrupt files, bad JSON, unknown class).
_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError, json.JSONDecodeError)


def lora_target_modules(lora_targets: str | None, model_type: str | None) -> list[str]:
    """The module names --lora-targets gives, or (None) the attention projections of the model's family."""
    names = lora_targets if lora_targets is not None else FAMILY_LORA_TARGETS.get(model_type, DEFAULT_LORA_TARGETS)
    return [name.strip() for name in names.split(",") if name.strip()]


def tiny_llama_config(vocab_size: int = 2048, **overrides):
    """A LlamaConfig for the embedded default model: a few million parameters, LLaMA architecture."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, **{**TINY_DEFAULTS, **overrides})


def network_allowed() -> bool:
    """zero-kit keeps the Hugging Face Hub offline (it sets HF_HUB_OFFLINE=1 where it is unset); a user who sets
    HF_HUB_OFFLINE to a false value (0, false, no, off) allows downloads, as huggingface_hub itself reads it."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("0", "FALSE", "NO", "OFF")


def hub_id(model: str | None) -> str | None:
    """`model` when it names a Hub repository (org/name) rather than a local path: no such path exists, and it has
    the Hub's one-slash form; None for a local directory (or a mistyped one, which the directory checks report)."""
    if model is None or Path(model).exists() or model.count("/") != 1 or model.startswith((".", "/", "~")):
        return None
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(model)
    except ValueError:
        return None
    return model


def missing_hub_model(model: str, why: str) -> UserError:
    """The one message for a Hub id that cannot be used: both ways out, download or a local directory."""
    how = "set HF_HUB_OFFLINE=0 to let zero-kit download it" if not network_allowed() else "check the name/network"
    return UserError(
        f"--model {model}: no such directory, and not in the Hugging Face cache as a Hub id ({why})",
        f"{how} (or `hf download {model}` first), or pass a local model directory (save_pretrained's output)",
    )


def resolve_model(model: str | None) -> str | None:
    """A local directory (or None) as given; a Hub id: its snapshot directory in the Hugging Face cache
    (HF_HUB_CACHE / HF_HOME), downloaded first only when network_allowed(). The rest of zero-kit reads that
    directory like any other, so a cached model behaves exactly like its snapshot path."""
    repo = hub_id(model)
    if repo is None:
        return model
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import EntryNotFoundError

    try:
        return snapshot_download(repo, local_files_only=not network_allowed())
    except (OSError, ValueError, EntryNotFoundError) as err:  # not cached, incomplete, no such repo, no network
        raise _hub_failure(repo, err) from None


def _hub_failure(repo: str, err: Exception) -> UserError:
    return missing_hub_model(repo, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")


def cached_hub_file(model: str, filename: str) -> Path | None:
    """`filename` of a Hub id's newest cached snapshot, or None: looked up in the cache only, nothing downloaded
    (the cheap checks run before any download)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model, filename)
    return Path(found) if isinstance(found, str) else None


def hub_config_file(repo: str, *, download: bool) -> Path | None:
    """A Hub id's config.json: from the cache; not cached and the network not allowed, the one missing-model
    error; not cached and allowed, downloaded alone when `download` (the planner reads nothing else), else None
    (the input checks leave the download to the run)."""
    cached = cached_hub_file(repo, "config.json")
    if cached is not None:
        return cached
    if not network_allowed():
        raise missing_hub_model(repo, "HF_HUB_OFFLINE is not 0, so zero-kit downloads nothing")
    if not download:
        return None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError

    try:
        return Path(hf_hub_download(repo, "config.json"))
    except (OSError, ValueError, EntryNotFoundError) as err:
        raise _hub_failure(repo, err) from None


def _check_model_dir(model_dir: str, *, need_config: bool = True, trust_remote_code: bool = False) -> Path:
    path = Path(model_dir)
    if not path.is_dir():
        raise UserError(f"--model {model_dir}: no such directory", "pass a local Hugging Face model directory")
    if need_config and not (path / "config.json").is_file():
        raise UserError(
            f"--model {model_dir}: no config.json, so not a Hugging Face model directory",
            "pass the directory written by save_pretrained (config.json, safetensors, tokenizer files)",
        )
    if not trust_remote_code:
        _refuse_remote_code(path)
    return path


def remote_code_files(path: Path) -> list[str]:
    """The files of a model directory that ask for code of the directory to run (an `auto_map` entry: a custom
    config, model or tokenizer class in a .py file beside it). Read as JSON only: nothing is imported."""
    found = []
    for name in REMOTE_CODE_CONFIGS:
        try:
            data = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # missing or unreadable: transformers' own load says what is wrong with it
        if isinstance(data, dict) and data.get("auto_map"):
            found.append(name)
    return found


def check_trusted(model_dir: str | None, trust_remote_code: bool) -> None:
    """Refuse a --model directory that names code of its own (auto_map) unless trust_remote_code: JSON reads only,
    so a command can say it before any launcher, import or rank (a missing directory is left to the loaders)."""
    if model_dir is not None and not trust_remote_code and Path(model_dir).is_dir():
        _refuse_remote_code(Path(model_dir))


def _refuse_remote_code(path: Path) -> None:
    found = remote_code_files(path)
    if found:
        raise UserError(
            f"--model {path}: {' and '.join(found)} name Python code of the directory (auto_map), which loading "
            "it would run with your rights: anyone who could write the directory could run anything as you",
            "use a model directory without auto_map, or pass --trust-remote-code if you trust whoever wrote it",
        )


def foreign_files(directory: Path) -> list[Path]:
    """`directory` and the files in it (one level down, and global_step*/) that another user owns. A checkpoint
    holds pickles that DeepSpeed and the Trainer load with weights_only=False (optimizer shards, rng_state,
    training_args.bin): whoever could write them could run code as the user who resumes from them."""
    uid = os.getuid()
    candidates = [directory, *directory.glob("*"), *directory.glob("global_step*/*")]
    return [path for path in candidates if _owner(path) not in (uid, None)]


def _owner(path: Path) -> int | None:
    try:
        return path.lstat().st_uid
    except OSError:
        return None


def foreign_warning(directory: Path, flag: str) -> str | None:
    """A warning line when another user owns `directory` or files in it (see foreign_files), else None."""
    foreign = foreign_files(directory)
    if not foreign:
        return None
    shown = ", ".join(str(p) for p in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    return (
        f"warning: {flag} {directory}: owned by another user ({shown}); DeepSpeed and the Trainer load its "
        "pickles, which can run code as you: resume only from checkpoints whose writers you trust, or copy it "
        "after checking where it came from"
    )


def load_tokenizer(model_dir: str | None = None, *, trust_remote_code: bool = False):
    """The tokenizer of model_dir (or the embedded one when None), with a pad token guaranteed. Code of the
    directory (auto_map) is refused unless trust_remote_code."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    model_dir = resolve_model(model_dir)  # a Hub id: its cached snapshot
    if model_dir is None:
        tokenizer = _asset_tokenizer(PreTrainedTokenizerFast)
    else:
        # a tokenizer-only directory is fine here
        _check_model_dir(model_dir, need_config=False, trust_remote_code=trust_remote_code)
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                model_dir, local_files_only=True, trust_remote_code=trust_remote_code
            )
        except _LOAD_ERRORS as err:
            raise UserError(
                f"--model {model_dir}: cannot load a tokenizer ({type(err).__name__}: {err})",
                "save the tokenizer into the model directory (tokenizer.save_pretrained(DIR))",
            ) from None
    if tokenizer.pad_token is None:
        # Padding positions never reach the loss (labels -100, attention 0), so reusing eos/unk is safe.
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise UserError(f"--model {model_dir}: tokenizer has no pad, eos or unk token", "add a pad token to it")
        tokenizer.pad_token = fallback
    return tokenizer


def _asset_tokenizer(fast_cls):
    """The shipped tokenizer; its tokenizer_config.json is transformers 5's format (extra_special_tokens a list,
    tokenizer_class TokenizersBackend), which 4.x misreads, so 4.x gets the same tokenizer built from parts."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return fast_cls.from_pretrained(str(ASSET_TOKENIZER))
    cfg = json.loads((ASSET_TOKENIZER / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer = fast_cls(
        tokenizer_file=str(ASSET_TOKENIZER / "tokenizer.json"),
        bos_token=cfg["bos_token"],
        eos_token=cfg["eos_token"],
        pad_token=cfg["pad_token"],
        additional_special_tokens=cfg["extra_special_tokens"],
        model_max_length=cfg["model_max_length"],
        clean_up_tokenization_spaces=cfg["clean_up_tokenization_spaces"],
        model_input_names=["input_ids", "attention_mask"],  # 4.x adds token_type_ids, which generate() refuses
    )
    tokenizer.chat_template = (ASSET_TOKENIZER / "chat_template.jinja").read_text(encoding="utf-8")
    return tokenizer


def build_config(model_dir: str | None = None, *, trust_remote_code: bool = False, **overrides):
    """The tiny LlamaConfig sized to the embedded tokenizer (None), or model_dir's config, checked LLaMA-style.
    Code of the directory (auto_map) is refused unless trust_remote_code."""
    if model_dir is None:
        tokenizer = load_tokenizer(None)
        ids = dict(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        return tiny_llama_config(vocab_size=len(tokenizer), **{**ids, **overrides})
    from transformers import AutoConfig

    model_dir = resolve_model(model_dir)  # a Hub id: its cached snapshot
    _check_model_dir(model_dir, trust_remote_code=trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    except _LOAD_ERRORS as err:
        raise UserError(
            f"--model {model_dir}: cannot read config.json ({type(err).__name__}: {err})", "fix or re-save config.json"
        ) from None
    if config.model_type not in LLAMA_STYLE_TYPES:
        raise UserError(
            f"--model {model_dir}: model_type {config.model_type!r} is not a LLaMA-style causal LM",
            f"use a checkpoint with model_type in {list(LLAMA_STYLE_TYPES)}",
        )
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


@contextmanager
def _seeded(seed: int):
    """Seed model init without disturbing the caller's global RNG streams."""
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def load_model(model_dir: str | None = None, *, dtype=None, seed: int = 0, trust_remote_code: bool = False):
    """The causal LM: the tiny default from its config (fp32 unless dtype), or from_pretrained(model_dir).

    For a directory, dtype None keeps the dtype the checkpoint was saved in. Code of the directory (auto_map) is
    refused unless trust_remote_code; pickled weights (*.bin) are read by transformers with weights_only.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model_dir = resolve_model(model_dir)  # a Hub id: its cached snapshot
    config = build_config(model_dir, trust_remote_code=trust_remote_code)
    with _seeded(seed):
        if model_dir is None:
            # _init_default_weights sets every parameter, so transformers' own init is skipped: in 4.x it
            # indexes the padding row of an embedding that zero.Init has already partitioned (IndexError).
            with _no_init_weights():
                model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
            _init_default_weights(model, seed)
            return model
        try:
            return AutoModelForCausalLM.from_pretrained(
                model_dir,
                config=config,
                local_files_only=True,
                dtype=dtype or "auto",
                trust_remote_code=trust_remote_code,
            )
        except _LOAD_ERRORS as err:
            raise UserError(
                f"--model {model_dir}: cannot load the weights ({type(err).__name__}: {err})",
                "check that the safetensors/bin files are complete (save_pretrained writes them)",
            ) from None


def _no_init_weights():
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4.57
    return no_init_weights()


def _gathered(param):
    """Inside: the full ZeRO-3 parameter, rank 0's edits partitioned back on exit; a no-op without ZeRO-3."""
    if not hasattr(param, "ds_id"):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=0)


def _init_default_weights(model, seed: int) -> None:
    """Seed each parameter from (seed, its name), LLaMA-style (normal(0, initializer_range), norms at one).

    Built under zero.Init, transformers initializes modules in another RNG order than without it, so the
    same seed gave different weights under ZeRO-3 than under DDP/FSDP. Per-name generators make the default
    model identical under every strategy, which a fair comparison needs (tests/dist/test_model_zero3_init.py).
    """
    import torch

    std, pad = model.config.initializer_range, model.config.pad_token_id
    with torch.no_grad():
        for name, param in model.named_parameters():
            with _gathered(param):
                generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
                if name.endswith("norm.weight"):
                    values = torch.ones(param.shape)
                else:
                    values = torch.randn(param.shape, generator=generator) * std
                if name.endswith("embed_tokens.weight") and pad is not None:
                    values[pad] = 0  # nn.Embedding(padding_idx) convention
                param.data.copy_(values.to(param.dtype))


def count_parameters(model) -> int:
    """Total parameters, counting ZeRO-3 partitioned ones at full size and tied weights once."""
    unique = {id(p): p for p in model.parameters()}
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in unique.values())

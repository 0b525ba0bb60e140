"""Model shapes: the dimensions of LLaMA-architecture decoders that decide parameter counts, activations and
buffers; the published shapes of the Meta checkpoints; reading a shape from a Hugging Face config.json; and the
LoRA adapter count on a shape. Pure data, shared by the planner, preflight and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

from zero_kit.errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
"""config.json `model_type`s whose decoder is a LlamaShape (RMSNorm, grouped-query attention, a gated MLP; the
family's variations are the fields FAMILY_LAYOUT sets): every other architecture is refused by name rather than
planned as a LLaMA."""

# What each family adds to the plain LLaMA block, as transformers builds it: q/k/v biases (Qwen2 always; LLaMA,
# Qwen3 and Gemma with attention_bias, which also biases o), per-head q/k RMSNorms (Qwen3, Gemma 3), two more
# norms around the MLP (Gemma 2/3), fused qkv_proj and gate_up_proj (Phi-3). Sizes follow the config's head_dim.
FAMILY_LAYOUT: dict[str, dict[str, bool]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
    "gemma2": {"sandwich_norms": True},
    "gemma3_text": {"qk_norm": True, "sandwich_norms": True},
    "phi3": {"fused": True},
}
# The config classes' defaults for keys a hand-written config.json may leave out.
TIED_BY_DEFAULT = ("gemma2", "gemma3_text")
ATTENTION_BIAS_FAMILIES = ("llama", "qwen3", "gemma2", "gemma3_text")
FAMILY_HEAD_DIM = {"qwen3": 128, "gemma2": 256, "gemma3_text": 256}


@dataclass(frozen=True)
class LlamaShape:
    """The dimensions of a LLaMA-style decoder that decide its parameter count and activations. The fields after
    tie_word_embeddings describe the other families (see FAMILY_LAYOUT); their defaults are the plain LLaMA."""

    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    config_head_dim: int | None = None
    """config.json's head_dim where it is not hidden_size / heads (Qwen3: 128, Gemma: 256 at any width)."""
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    fused: bool = False

    @property
    def head_dim(self) -> int:
        return self.config_head_dim or self.hidden_size // self.heads

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def block_params(self) -> int:
        """One decoder layer: attention, gated MLP, norms and biases, whatever the family's layout."""
        return sum(self._block_numels())

    @property
    def n_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.layers * self.block_params + self.hidden_size

    def _block_numels(self) -> list[int]:
        """One layer's parameters in `named_parameters()` order (each bias right after its weight)."""
        h, q, kv, inter = self.hidden_size, self.heads * self.head_dim, self.kv_size, self.intermediate_size
        if self.fused:  # Phi-3: o_proj, qkv_proj, gate_up_proj, down_proj, two norms
            return [q * h, h * (q + 2 * kv), h * 2 * inter, inter * h, h, h]
        attention = []
        for numel, bias in ((h * q, q), (h * kv, kv), (h * kv, kv)):
            attention += [numel, bias] if self.qkv_bias else [numel]
        attention += [q * h, h] if self.o_bias else [q * h]
        norms_qk = [self.head_dim, self.head_dim] if self.qk_norm else []
        mlp = [h * inter, inter, h * inter, inter, inter * h, h] if self.mlp_bias else [h * inter] * 2 + [inter * h]
        return attention + norms_qk + mlp + [h] * (4 if self.sandwich_norms else 2)

    def param_numels(self) -> list[int]:
        """Every parameter's element count in `model.parameters()` order (what DeepSpeed flattens)."""
        h = self.hidden_size
        head = [] if self.tie_word_embeddings else [self.vocab_size * h]
        return [self.vocab_size * h, *self._block_numels() * self.layers, h, *head]

    @property
    def largest_layer_params(self) -> int:
        """The biggest single module's own parameters, as DeepSpeed's `model_to_params` counts (embedding or MLP)."""
        h, q, inter = self.hidden_size, self.heads * self.head_dim, self.intermediate_size
        if self.fused:
            return max(self.vocab_size * h, 2 * h * inter, h * (q + 2 * self.kv_size))
        bias_q, bias_o, bias_mlp = int(self.qkv_bias), int(self.o_bias), int(self.mlp_bias)
        return max(self.vocab_size * h, (h + bias_mlp) * inter, (h + bias_q) * q, (q + bias_o) * h)

    def lora_params(self, rank: int) -> int:
        """LoRA adapter parameters on every linear of each block (q, k, v, o, gate, up, down; Phi-3's fused
        qkv_proj and gate_up_proj count once each): r x (in + out) per linear."""
        h, q, kv, inter = self.hidden_size, self.heads * self.head_dim, self.kv_size, self.intermediate_size
        if self.fused:
            per_layer = (h + q + 2 * kv) + (q + h) + (h + 2 * inter) + (inter + h)
        else:
            per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h)
        return rank * per_layer * self.layers


def _llama2(h: int, layers: int, heads: int, kv: int, inter: int) -> LlamaShape:
    return LlamaShape(h, layers, heads, kv, inter, 32000)


def _llama3(h: int, layers: int, heads: int, kv: int, inter: int, tied: bool = False) -> LlamaShape:
    return LlamaShape(h, layers, heads, kv, inter, 128256, tied)


# Published config.json values of the Meta checkpoints (3.1 shares 3's shapes).
KNOWN_SHAPES: dict[str, LlamaShape] = {
    "tinyllama-1.1b": LlamaShape(2048, 22, 32, 4, 5632, 32000),
    "llama-2-7b": _llama2(4096, 32, 32, 32, 11008),
    "llama-2-13b": _llama2(5120, 40, 40, 40, 13824),
    "llama-2-70b": _llama2(8192, 80, 64, 8, 28672),
    "llama-3.2-1b": _llama3(2048, 16, 32, 8, 8192, tied=True),
    "llama-3.2-3b": _llama3(3072, 28, 24, 8, 8192, tied=True),
    "llama-3-8b": _llama3(4096, 32, 32, 8, 14336),
    "llama-3.1-8b": _llama3(4096, 32, 32, 8, 14336),
    "llama-3-70b": _llama3(8192, 80, 64, 8, 28672),
    "llama-3.1-70b": _llama3(8192, 80, 64, 8, 28672),
    "llama-3.1-405b": _llama3(16384, 126, 128, 8, 53248),
}


def closest_known_shape(n_params: int) -> tuple[str, LlamaShape]:
    """The known shape nearest in parameter count (by ratio), to stand in for dimensions the user did not give."""
    return min(KNOWN_SHAPES.items(), key=lambda item: abs(item[1].n_params / n_params - 1))


def shape_from_hf_config(config: dict) -> LlamaShape:
    """A LlamaShape from a Hugging Face config.json (a family of SUPPORTED_MODEL_TYPES); KeyError names a missing key.
    Another `model_type` (bert, gpt2, ...) is a UserError naming it and the supported ones: its parameter
    count follows other formulas, and a LLaMA plan of it would be wrong without saying so."""
    model_type = config.get("model_type")
    if model_type is not None and model_type not in SUPPORTED_MODEL_TYPES:
        named = f" ({', '.join(map(str, config['architectures']))})" if config.get("architectures") else ""
        raise UserError(
            f"model_type {model_type!r}{named} is not a supported architecture;"
            f" supported: {', '.join(SUPPORTED_MODEL_TYPES)}",
            "plan a LLaMA-style model, or give its size with --params N (and --hidden-size/--layers)",
        )
    family = model_type or "llama"
    layout = FAMILY_LAYOUT[family]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or FAMILY_HEAD_DIM.get(family)  # None: hidden_size / heads
    # attention_bias biases q, k, v and o where the family reads it (Mistral and Phi-3 never bias, Qwen2 only q/k/v)
    attention_bias = bool(config.get("attention_bias", False)) and family in ATTENTION_BIAS_FAMILIES
    return LlamaShape(
        hidden_size=config["hidden_size"],
        layers=config["num_hidden_layers"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", family in TIED_BY_DEFAULT)),
        config_head_dim=None if head_dim == config["hidden_size"] // heads else head_dim,
        qkv_bias=layout.get("qkv_bias", False) or attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)) and family == "llama",
        qk_norm=layout.get("qk_norm", False),
        sandwich_norms=layout.get("sandwich_norms", False),
        fused=layout.get("fused", False),
    )


def local_model_params(model: str | None) -> int | None:
    """The parameters a local model directory's config.json describes, read without torch or transformers; None for
    anything else (no directory, a Hub id, an architecture this module does not know)."""
    import json
    from pathlib import Path

    if not model:
        return None
    try:
        return shape_from_hf_config(json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))).n_params
    except (OSError, ValueError, UserError, KeyError, TypeError, AttributeError):
        return None


def hf_config(shape: LlamaShape) -> dict:
    """The Hugging Face config.json keys of `shape` (the inverse of shape_from_hf_config), for LlamaConfig(**...)."""
    return {
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings,
    }

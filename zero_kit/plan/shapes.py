"""Model shapes: the dimensions of LLaMA-architecture decoders that decide parameter counts, activations and
buffers; the published shapes of the Meta checkpoints; reading a shape from a Hugging Face config.json; and the
LoRA adapter count on a shape. Pure data, shared by the planner, preflight and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

from zero_kit.errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""config.json `model_type`s whose decoder is the LlamaShape formula (SwiGLU MLP, RMSNorm, grouped-query
attention, no biases that count): every other architecture is refused by name rather than planned as a LLaMA."""


def lora_trainable_params(hidden_size: int, layers: int, rank: int, kv_size: int, intermediate: int) -> int:
    """LoRA adapter parameters on every linear of each block (q, k, v, o, gate, up, down): r x (in + out) each."""
    per_layer = (
        (hidden_size + hidden_size)  # q
        + 2 * (hidden_size + kv_size)  # k, v
        + (hidden_size + hidden_size)  # o
        + 2 * (hidden_size + intermediate)  # gate, up
        + (intermediate + hidden_size)  # down
    )
    return rank * per_layer * layers


@dataclass(frozen=True)
class LlamaShape:
    """The dimensions of a LLaMA-architecture decoder that decide its parameter count and activations."""

    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def block_params(self) -> int:
        """One decoder layer: q, k, v, o projections, SwiGLU MLP (gate, up, down), two RMSNorm weights."""
        h, q = self.hidden_size, self.heads * self.head_dim
        return h * q + 2 * h * self.kv_size + q * h + 3 * h * self.intermediate_size + 2 * h

    @property
    def n_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.layers * self.block_params + self.hidden_size

    def param_numels(self) -> list[int]:
        """Every parameter's element count in `model.parameters()` order (what DeepSpeed flattens)."""
        h, q, kv, inter = self.hidden_size, self.heads * self.head_dim, self.kv_size, self.intermediate_size
        block = [h * q, h * kv, h * kv, q * h, h * inter, h * inter, inter * h, h, h]
        head = [] if self.tie_word_embeddings else [self.vocab_size * h]
        return [self.vocab_size * h, *block * self.layers, h, *head]

    @property
    def largest_layer_params(self) -> int:
        """The biggest single module's own parameters, as DeepSpeed's `model_to_params` counts (embedding or MLP)."""
        h = self.hidden_size
        return max(self.vocab_size * h, h * self.intermediate_size, h * self.heads * self.head_dim)


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
    """A LlamaShape from a Hugging Face config.json (llama, mistral, qwen2 keys); KeyError names a missing key.
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
    heads = config["num_attention_heads"]
    return LlamaShape(
        hidden_size=config["hidden_size"],
        layers=config["num_hidden_layers"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


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

"""LLaMA-style models: the embedded tiny default (built from a config, nothing downloaded) and local HF checkpoints."""

from __future__ import annotations

TINY_DEFAULTS = dict(
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


def tiny_llama_config(vocab_size: int = 2048, **overrides):
    """A LlamaConfig for the embedded default model: a few million parameters, LLaMA architecture."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, **{**TINY_DEFAULTS, **overrides})

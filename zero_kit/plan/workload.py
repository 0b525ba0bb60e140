"""What is trained, per rank and step: the model's shape and size, the sequence, micro batch, precision, LoRA,
activation checkpointing and whether examples are preference pairs (DPO). Shared by the memory, traffic and timing
models of `zero-kit plan`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zero_kit.plan.shapes import LlamaShape


@dataclass(frozen=True)
class Workload:
    shape: LlamaShape
    n_params: int
    seq_len: int = 2048
    micro_batch: int = 1
    precision: str = "bf16"
    lora_r: int | None = None
    activation_checkpointing: bool = False
    preference: bool = False
    """DPO (`--method dpo`): every example is a pair, two sequences through the model, and every step also runs the
    frozen reference model forward over both (full fine-tuning: a second copy of the weights; LoRA: the same weights,
    adapter off)."""
    sp: int = 1
    """Ulysses sequence parallelism (`--sp`): each sequence is split over `sp` ranks. A rank holds seq_len / sp of
    its tokens outside attention and, inside it, the whole sequence for heads / sp of the heads: activations, logits
    and compute per rank are those of `rank_tokens`."""

    @property
    def sequences(self) -> int:
        """Sequences per rank in one forward pass: the micro batch, twice that for preference pairs."""
        return self.micro_batch * (2 if self.preference else 1)

    @property
    def rank_tokens(self) -> int:
        """Tokens each rank holds in one forward pass (b s / sp): what its activations and its compute scale with."""
        return self.sequences * self.seq_len // self.sp

    @property
    def trainable_params(self) -> int | None:
        if not self.lora_r:
            return None
        return self.shape.lora_params(self.lora_r)


def from_record(record: dict[str, Any]) -> Workload:
    """The Workload of a `zero-kit bench` record: its model's shape, sequence, micro batch and precision."""
    model = record["model"]
    shape = LlamaShape(model["hidden"], model["layers"], model["heads"], model["kv_heads"], model["intermediate"],
                       model["vocab"], model.get("tie_word_embeddings", False))  # fmt: skip
    return Workload(shape, model["n_params"], model["seq_len"], record["batch"]["micro"], record["precision"])

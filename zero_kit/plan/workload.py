"""What is trained, per rank and step: the model's shape and size, the sequence, micro batch, precision, LoRA,
activation checkpointing and whether examples are preference pairs (DPO). Shared by the memory, traffic and timing
models of `zero-kit plan`."""

from __future__ import annotations

import math
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
    reference_precomputed: bool = False
    """DPO with its reference log-probabilities computed once before training (`--dpo-reference precompute`): no
    reference weights held and no reference forward in the step."""
    sp: int = 1
    """Ulysses sequence parallelism (`--sp`): each sequence is split over `sp` ranks. A rank holds seq_len / sp of
    its tokens outside attention and, inside it, the whole sequence for heads / sp of the heads: activations, logits
    and compute per rank are those of `rank_tokens`."""

    @property
    def sequences(self) -> int:
        """Sequences per rank in one forward pass: the micro batch, twice that for preference pairs."""
        return self.micro_batch * (2 if self.preference else 1)

    packed: bool = False
    """Rows packed to seq_len (`--pack`): attention gets each packed row's document mask (the CPU ranks' memory
    check charges what CPU attention holds for it, zero_kit.train.guards.fit.cpu_scores_bytes)."""

    tiled: bool = False
    """DeepSpeed's tiled MLP and tiled logits-loss (`--tiled-compute`): the MLP's intermediate tensors and the fp32
    logits exist for one slice of the sequence at a time (`tile_slices`); the MLP saves only its input."""

    @property
    def slices(self) -> int:
        """The slices a tiled run cuts each rank's sequence into (1 untiled)."""
        if not self.tiled:
            return 1
        return tile_slices(self.seq_len // self.sp, self.sequences, self.shape.hidden_size, self.shape.vocab_size)

    @property
    def rank_tokens(self) -> int:
        """Tokens each rank holds in one forward pass (b s / sp): what its activations and its compute scale with."""
        return self.sequences * self.seq_len // self.sp

    @property
    def trainable_params(self) -> int | None:
        if not self.lora_r:
            return None
        return self.shape.lora_params(self.lora_r)


LOGITS_SLICE_BYTES = 2**30
"""A slice of the tiled loss holds at most this many bytes of fp32 logits."""


def tile_slices(length: int, rows: int, hidden: int, vocab: int) -> int:
    """Slices of a sequence of `length` tokens (per rank) under tiled compute: ceil(length / h), DeepSpeed's choice for
    its TiledMLP, and enough that one slice's fp32 logits of `rows` rows stay under LOGITS_SLICE_BYTES
    (zero_kit.train.long_sequences.tiled cuts the same)."""
    return max(1, math.ceil(length / hidden), math.ceil(length * rows * vocab * 4 / LOGITS_SLICE_BYTES))


def from_record(record: dict[str, Any]) -> Workload:
    """The Workload of a `zero-kit bench` record: its model's shape, sequence, micro batch and precision."""
    model = record["model"]
    shape = LlamaShape(model["hidden"], model["layers"], model["heads"], model["kv_heads"], model["intermediate"],
                       model["vocab"], model.get("tie_word_embeddings", False))  # fmt: skip
    return Workload(shape, model["n_params"], model["seq_len"], record["batch"]["micro"], record["precision"])

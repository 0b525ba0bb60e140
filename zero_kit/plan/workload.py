"""What is trained, per rank and step: the model's shape and size, the sequence, micro batch, precision, LoRA and
activation checkpointing. Shared by the memory, traffic and timing models of `zero-kit plan`."""

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

"""`zero-kit export`: a complete ZeRO checkpoint written by `zero-kit train` -> a plain Hugging Face directory
(safetensors, config, tokenizer) or a peft LoRA adapter. checks (before any import or read), reader (the ranks'
shards as byte ranges), writer (safetensors a tensor at a time), to_hf (the export itself)."""

from zero_kit.export.to_hf import export_checkpoint

__all__ = ["export_checkpoint"]

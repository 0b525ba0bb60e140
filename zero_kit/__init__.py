"""zero_kit: DeepSpeed ZeRO configs, linting, memory planning, fine-tuning and benchmarks for LLaMA-style models."""

__version__ = "0.1.0"

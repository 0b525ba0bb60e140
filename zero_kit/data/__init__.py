"""Training data: files (JSONL/JSON/CSV/Parquet/saved datasets), row formats (alpaca, chat, text), tokenizing with
prompt masking, packing and collation."""

from zero_kit.data.dataset import collate, default_data_path, load_dataset_rows, pack_examples, tokenize_dataset

__all__ = ["collate", "default_data_path", "load_dataset_rows", "pack_examples", "tokenize_dataset"]

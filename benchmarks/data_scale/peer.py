"""The peer of the data_scale study: LLaMA-Factory's own SFT preprocessing (its `get_dataset`, the function its
`llamafactory-cli train` calls before the model is loaded) on an alpaca JSONL file, with zero_kit's embedded
tokenizer and its sequence length (256). Run by benchmarks/data_scale/run.py with the peer venv's python; prints one
JSON line. Standalone on purpose: the peer venv has LLaMA-Factory's pins, not zero_kit's.

    build/venv-peer/bin/python benchmarks/data_scale/peer.py --data ROWS.jsonl --cache DIR [--workers 2]

--cache is the datasets cache (HF_DATASETS_CACHE): a fresh one is the first start, the same one again the second
(LLaMA-Factory's datasets cache its Arrow files there and find them again by fingerprint).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()
REPO = Path(__file__).resolve().parents[2]
TOKENIZER_JSON = REPO / "zero_kit" / "assets" / "tokenizer" / "tokenizer.json"
MAX_LENGTH = 256  # zero-kit train's --max-length default


def tokenizer_dir(work: Path) -> Path:
    """zero_kit's tokenizer saved by this venv's transformers, beside a LLaMA config.json (never loaded as a model)."""
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    target = work / "tokenizer"
    if (target / "config.json").is_file():
        return target
    config = json.loads((TOKENIZER_JSON.parent / "tokenizer_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER_JSON),
        bos_token=config["bos_token"],
        eos_token=config["eos_token"],
        pad_token=config["pad_token"],
        model_max_length=config["model_max_length"],
    )
    tokenizer.save_pretrained(target)
    LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(target)  # fmt: skip
    return target


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--workers", type=int, default=2, help="preprocessing_num_workers (the host's 2 cores)")
    args = parser.parse_args()
    cache = Path(args.cache).absolute()
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["HF_DATASETS_CACHE"] = str(cache / "datasets")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = Path(args.data).absolute()
    (cache / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": str(data)}}))

    import llamafactory
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    imported = time.perf_counter()
    model_args, data_args, training_args, _, _ = get_train_args(
        dict(stage="sft", do_train=True, model_name_or_path=str(tokenizer_dir(cache)), dataset="rows",
             dataset_dir=str(cache), template="default", cutoff_len=MAX_LENGTH, output_dir=str(cache / "out"),
             preprocessing_num_workers=args.workers, finetuning_type="full", report_to="none", use_cpu=True,
             overwrite_output_dir=True)
    )  # fmt: skip
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    prepared = time.perf_counter()
    module = get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
    done = time.perf_counter()
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime  # the workers that have ended
    print(json.dumps({
        "llamafactory": llamafactory.__version__,
        "rows_out": len(module["train_dataset"]),
        "imports_s": round(imported - STARTED, 1),
        "preprocess_s": round(done - prepared, 1),
        "total_s": round(done - STARTED, 1),
        "cpu_s": round(cpu, 1),
        "peak_rss_mib": round(own.ru_maxrss / 1024),
        "peak_rss_mib_largest_worker": round(workers.ru_maxrss / 1024),
        "workers": args.workers,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

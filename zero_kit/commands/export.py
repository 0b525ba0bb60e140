"""`zero-kit export CHECKPOINT_DIR --out DIR`: a complete ZeRO checkpoint written by `zero-kit train` ->
a plain Hugging Face directory (safetensors + config + tokenizer) that `from_pretrained` loads without
DeepSpeed; for a LoRA run a peft adapter directory, or merged weights with --merge.

Prints the peak resident memory of the export (getrusage ru_maxrss): it streams one tensor at a time.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                        help="OUTPUT/checkpoint-N written by zero-kit train; or the OUTPUT of a run still training: "
                             "its newest complete checkpoint")  # fmt: skip
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write the exported model into")
    parser.add_argument("--merge", action="store_true", help="LoRA runs: fold the adapters into full weights")
    parser.add_argument(
        "--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help="weights dtype (default fp32)"
    )
    parser.add_argument("--max-shard-mib", type=int, default=1024, help="largest safetensors file, MiB (default 1024)")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the run's --model run Python code of its own directory (auto_map); off: such a model is refused",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into a non-empty --out directory that zero-kit did not write"
    )


def run(args: argparse.Namespace) -> int:
    from zero_kit.export.checks import check_export, check_still_complete, live_run_checkpoint
    from zero_kit.export.to_hf import describe, export_checkpoint, peak_rss_mib

    source = Path(args.checkpoint)
    live = live_run_checkpoint(source)  # an output a run still trains into: its newest complete checkpoint
    if live is not None:
        source = live[0]
        print(f"zero-kit export: {live[1]}", flush=True)
    check_export(
        source, Path(args.out), force=args.force, trust_remote_code=args.trust_remote_code
    )  # a mistake is said before any import
    out = export_checkpoint(
        source,
        Path(args.out),
        merge=args.merge,
        dtype=args.dtype,
        max_shard_mib=args.max_shard_mib,
        trust_remote_code=args.trust_remote_code,
        force=args.force,
    )
    if live is not None:
        check_still_complete(source)
    print(f"zero-kit export: wrote {describe(out)}")
    # the kernel's own high-water mark, read once at the end (benchmarks/export_scale measures the process tree)
    print(f"zero-kit export: peak RSS {peak_rss_mib():.0f} MiB (getrusage ru_maxrss, includes mmapped shard pages)")
    return 0

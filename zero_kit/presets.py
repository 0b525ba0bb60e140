"""The presets in `ds_configs/`: each one is `zero-kit config` with the flags below, never hand-edited.

Regenerate with `python -m zero_kit.presets` (tests/unit/test_presets.py regenerates and diffs).
Plain presets size their buckets for hidden size 4096 (Llama-2-7B, Llama-3-8B, Mistral-7B) and leave
the global batch to DeepSpeed (micro batch x grad accum x the real world size), so they run at any world
size; the `hf_` presets leave to the Hugging Face Trainer every value it fills ("auto").
"""

from __future__ import annotations

import sys
from pathlib import Path

PRESET_HIDDEN_SIZE = "4096"
_SIZED = ["--hidden-size", PRESET_HIDDEN_SIZE]

PRESETS: dict[str, list[str]] = {
    "zero0": ["--stage", "0"],
    "zero1": ["--stage", "1", *_SIZED],
    "zero2": ["--stage", "2", *_SIZED],
    "zero2_offload": ["--stage", "2", "--offload-optimizer", "cpu", *_SIZED],
    "zero3": ["--stage", "3", *_SIZED],
    "zero3_offload": ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu", *_SIZED],
    "hf_zero1": ["--stage", "1", "--hf-auto"],
    "hf_zero2": ["--stage", "2", "--hf-auto"],
    "hf_zero2_offload": ["--stage", "2", "--offload-optimizer", "cpu", "--hf-auto"],
    "hf_zero3": ["--stage", "3", "--hf-auto"],
    "hf_zero3_offload": ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu", "--hf-auto"],
}

PRESETS_DIR = Path(__file__).resolve().parent.parent / "ds_configs"


def write_presets(directory: Path) -> list[Path]:
    """Run `zero-kit config` for every preset into `directory`; returns the files written."""
    from zero_kit.cli import main

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, flags in PRESETS.items():
        path = directory / f"{name}.json"
        code = main(["config", *flags, "-o", str(path)])
        if code != 0:
            raise SystemExit(f"preset {name}: zero-kit config {' '.join(flags)} exited {code}")
        written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else PRESETS_DIR
    for path in write_presets(target):
        print(path)

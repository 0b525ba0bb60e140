"""The presets in `ds_configs/`: each one is the generator's output for the spec below, never hand-edited
(`zero-kit config` with the same flags writes the same file; tests/unit/test_presets.py checks both).

Regenerate with `python -m zero_kit.config.presets` (tests/unit/test_presets.py regenerates and diffs).
Plain presets size their buckets for hidden size 4096 (Llama-2-7B, Llama-3-8B, Mistral-7B) and leave
the global batch to DeepSpeed (micro batch x grad accum x the real world size), so they run at any world
size; the `hf_` presets leave to the Hugging Face Trainer every value it fills ("auto").
"""

from __future__ import annotations

from pathlib import Path

from zero_kit.config.builder import build_ds_config, dumps
from zero_kit.config.spec import ZeroSpec
from zero_kit.log import say

PRESET_HIDDEN_SIZE = 4096
_SIZED = {"hidden_size": PRESET_HIDDEN_SIZE}
_CPU_BOTH = {"offload_optimizer": "cpu", "offload_param": "cpu"}
# ZeRO++ for multi-node runs on 8-GPU nodes: a node-local secondary parameter shard (hpZ, size 8), int8 weight
# all-gathers (qwZ) and int4 gradient reduction (qgZ); CUDA only. Runs at any multiple of 8 GPUs.
_ZEROPP = {"hpz_partition_size": 8, "quantized_weights": True, "quantized_gradients": True}
# DeepSpeed's low-precision model states: bf16 master weights, gradients and Adam moments, autocast for the
# precision-sensitive ops (about 10 instead of 18 bytes of model state per parameter).
_BF16_STATES = {"bf16_master_weights": True, "bf16_optimizer_states": True, "torch_autocast": True}

PRESETS: dict[str, ZeroSpec] = {
    "zero0": ZeroSpec(stage=0),
    "zero1": ZeroSpec(stage=1, **_SIZED),
    "zero2": ZeroSpec(stage=2, **_SIZED),
    "zero2_offload": ZeroSpec(stage=2, offload_optimizer="cpu", **_SIZED),
    "zero3": ZeroSpec(stage=3, **_SIZED),
    "zero3_offload": ZeroSpec(stage=3, **_CPU_BOTH, **_SIZED),
    "zero3_zeropp": ZeroSpec(stage=3, **_ZEROPP, **_SIZED),
    "zero3_bf16_states": ZeroSpec(stage=3, **_BF16_STATES, **_SIZED),
    "hf_zero1": ZeroSpec(stage=1, hf_auto=True),
    "hf_zero2": ZeroSpec(stage=2, hf_auto=True),
    "hf_zero2_offload": ZeroSpec(stage=2, offload_optimizer="cpu", hf_auto=True),
    "hf_zero3": ZeroSpec(stage=3, hf_auto=True),
    "hf_zero3_offload": ZeroSpec(stage=3, **_CPU_BOTH, hf_auto=True),
    "hf_zero3_zeropp": ZeroSpec(stage=3, **_ZEROPP, hf_auto=True),
    "hf_zero3_bf16_states": ZeroSpec(stage=3, **_BF16_STATES, hf_auto=True),
}

PRESETS_DIR = Path(__file__).resolve().parents[2] / "ds_configs"


def write_presets(directory: Path) -> list[Path]:
    """Write every preset into `directory`; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, spec in PRESETS.items():
        path = directory / f"{name}.json"
        path.write_text(dumps(build_ds_config(spec)), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m zero_kit.config.presets", description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=PRESETS_DIR,
                        help=f"where the presets go (default: the repository's {PRESETS_DIR.name}/)")  # fmt: skip
    for path in write_presets(parser.parse_args(argv).directory):
        say(path)


if __name__ == "__main__":
    main()

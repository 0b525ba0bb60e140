"""Regenerate the checked-in multi-node launch material with `zero-kit launch`, from the repository root:

    python -m benchmarks.launch_files.generate

writes benchmarks/launch_files/slurm/zero3_deepspeed.sbatch (deepspeed launcher, --no_ssh, one srun task per node),
benchmarks/launch_files/slurm/fsdp_torchrun.sbatch (torchrun static rendezvous) and
benchmarks/launch_files/hostfile.example (pdsh hostfile). tests/unit/test_launch.py regenerates them and diffs, so
they never drift from the code. Submit with `sbatch benchmarks/launch_files/slurm/zero3_deepspeed.sbatch` from the
repository root (with .venv installed on every node and a LLaMA config directory at models/llama-1b, e.g. a copy
of Llama-3.2-1B's config.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN = {"model": "models/llama-1b", "precision": "bf16", "seq_len": 2048, "micro_batch": 1, "steps": 30, "warmup": 5}


def _slurm(launcher: str, strategy: str) -> list[str]:
    return [
        "launch", "--slurm", "--nodes", "2", "--gpus-per-node", "8", "--launcher", launcher, "--venv", ".venv",
        "--job-name", f"zk-{strategy}", "--",
        "--strategy", strategy, "--options-json", json.dumps(RUN), "--record", f"{strategy}.jsonl",
    ]  # fmt: skip


FILES: dict[str, list[str]] = {
    "slurm/zero3_deepspeed.sbatch": _slurm("deepspeed", "zero3"),
    "slurm/fsdp_torchrun.sbatch": _slurm("torchrun", "fsdp"),
    "hostfile.example": ["launch", "--write-hostfile", "{out}", "--hosts", "node1,node2", "--gpus-per-node", "8"],
}


def generate(out_dir: Path) -> list[Path]:
    from zero_kit.cli import main

    written = []
    for name, argv in FILES.items():
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        argv = [a.replace("{out}", str(path)) for a in argv]
        if "--slurm" in argv:
            argv = argv[: argv.index("--")] + ["-o", str(path)] + argv[argv.index("--") :]
        if main(argv) != 0:
            raise SystemExit(f"zero-kit {' '.join(argv)} failed")
        written.append(path)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE, help="where to write them (default: beside this script)")
    generate(parser.parse_args().out)

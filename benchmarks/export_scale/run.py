"""`zero-kit export` against DeepSpeed's own `zero_to_fp32.py` on one ZeRO-3 checkpoint of a ~0.42B LLaMA-shape model
(random init from a LlamaConfig, two CPU ranks, one step): peak resident memory, wall time and the tensors out.

    python -m benchmarks.export_scale.run                       # prepare once (cached in --work), then 3 x A/B/C
    python -m benchmarks.export_scale.run --repeats 5 --out benchmarks/export_scale/results \
        --baseline /tmp/zk_base      # also an older zero_kit's export: git archive 38e012e zero_kit | tar -x -C ...

Per repeat, in alternating order: A `zero-kit export CKPT --out DIR` (as `python -m zero_kit.cli`, so PYTHONPATH
picks the zero_kit), B `python CKPT/zero_to_fp32.py CKPT DIR
--safe_serialization` (the script DeepSpeed writes into every checkpoint), C DeepSpeed's
`get_fp32_state_dict_from_zero_checkpoint(CKPT)` then safetensors' `save_file` (what a user's own script calls).
Peak RSS is the peak of the child's process tree's RSS, sampled every 10 ms (it counts the mmapped checkpoint pages
a process touched). The child's ru_maxrss from wait4 (what /usr/bin/time -v prints) is recorded too but not used:
Linux folds the forked copy's RSS into it at exec (fs/exec.c, setmax_mm_hiwater_rss), so a child of this
benchmark, which holds the tensors it compared, starts from this process's size (0.4B: 1954 MiB for an export whose
tree never exceeded 348 MiB). The page cache is warm for every tool (an untimed export first).
Every output is compared tensor by tensor with torch.equal against B's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=16,
             max_position_embeddings=512, tie_word_embeddings=False)  # fmt: skip
REPO = Path(__file__).resolve().parents[2]  # this checkout's zero_kit, for `python -m zero_kit.cli`
LAYERS = 32  # 0.415B parameters; ZeRO-3 training at fp32 holds ~20 bytes per parameter over the two ranks
TRAIN = ["--nproc", "2", "--stage", "3", "--max-steps", "1", "--max-length", "64", "--micro-batch", "1", "--skip-bad"]
USER_SCRIPT = """
import sys
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
from safetensors.torch import save_file
save_file(get_fp32_state_dict_from_zero_checkpoint(sys.argv[1]), sys.argv[2] + "/model.safetensors")
"""


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def prepare(work: Path, layers: int) -> Path:
    """The checkpoint to export (built once: a random-init model directory, then one ZeRO-3 step on 2 CPU ranks)."""
    work = work / f"layers{layers}"
    checkpoint = work / "train" / "checkpoint-1"
    if (checkpoint / "zero_kit_complete.json").is_file():
        return checkpoint
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from zero_kit.model import load_tokenizer

    tokenizer = load_tokenizer(None)
    config = LlamaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, num_hidden_layers=layers, **SHAPE
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters", flush=True)
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    del model
    shutil.rmtree(work / "train", ignore_errors=True)
    cmd = [_bin("zero-kit"), "train", "--model", str(work / "model"), *TRAIN, "--no-export", "--output"]
    subprocess.run([*cmd, str(work / "train")], check=True)
    return checkpoint


def measure(argv: list[str], out_dir: Path, extra_env: dict) -> dict:
    """Run `argv` once: wall seconds, the child's ru_maxrss (wait4) and the peak RSS of its process tree (sampled)."""
    import psutil

    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    started = time.perf_counter()
    # cwd outside any checkout: `python -m` puts the cwd first on sys.path, ahead of PYTHONPATH
    env, cwd = {**_env(), **extra_env}, out_dir.parent
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    tree_peak = 0
    while True:  # wait4 with WNOHANG, not Popen.poll: the rusage of the child is only handed to whoever reaps it
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        tree_peak = max(tree_peak, _tree_rss(psutil, proc.pid))
        time.sleep(0.01)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace")
    if proc.returncode:
        raise SystemExit(f"{argv} exited {proc.returncode}\n{stderr[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "max_rss_mib": round(usage.ru_maxrss / 1024),
        "tree_peak_rss_mib": round(tree_peak / 2**20),
    }


def _tree_rss(psutil, pid: int) -> int:
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def tools(checkpoint: Path, out: Path, baseline: Path | None) -> dict[str, tuple[list[str], Path, dict]]:
    """name -> (argv, the directory it writes, environment overrides): the ways to turn the checkpoint into
    safetensors; with `baseline` (a source tree of an older zero_kit) also that zero-kit's export."""
    zero_kit = [sys.executable, "-m", "zero_kit.cli", "export", str(checkpoint), "--force", "--out"]
    found = {
        "zero-kit export": ([*zero_kit, str(out / "zero_kit")], out / "zero_kit", {"PYTHONPATH": str(REPO)}),
        "zero_to_fp32.py": (
            [sys.executable, str(checkpoint / "zero_to_fp32.py"), str(checkpoint), str(out / "zero_to_fp32"),
             "--safe_serialization"],
            out / "zero_to_fp32",
            {},
        ),
        "get_fp32_state_dict_from_zero_checkpoint": (
            [sys.executable, "-c", USER_SCRIPT, str(checkpoint), str(out / "user")], out / "user", {}
        ),
    }  # fmt: skip
    if baseline is not None:
        argv = [*zero_kit, str(out / "baseline")]
        found["zero-kit export (baseline)"] = (argv, out / "baseline", {"PYTHONPATH": str(baseline)})
    return found


def same_tensors(reference: Path, other: Path) -> bool:
    """Every tensor of `other` equals (torch.equal) `reference`'s of the same name, and the names are the same."""
    import torch
    from safetensors import safe_open

    def tensors(path: Path) -> dict:
        found = {}
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                found.update({name: file for name in handle.keys()})  # noqa: SIM118 (not a dict)
        return found

    want, got = tensors(reference), tensors(other)
    if sorted(want) != sorted(got):
        return False
    for name in want:
        with safe_open(str(want[name]), framework="pt") as a, safe_open(str(got[name]), framework="pt") as b:
            left, right = a.get_tensor(name), b.get_tensor(name)
            if left.dtype != right.dtype or not torch.equal(left, right):
                return False
    return True


def versions() -> dict:
    import deepspeed
    import safetensors
    import torch
    import transformers

    import zero_kit

    return {
        "python": platform.python_version(), "torch": torch.__version__, "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__, "safetensors": safetensors.__version__,
        "zero_kit": getattr(zero_kit, "__version__", "?"), "git": _git_head(),
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }  # fmt: skip


def _git_head() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/zk_export_scale"), help="model, checkpoint, outputs")
    parser.add_argument("--layers", type=int, default=LAYERS, help=f"decoder layers (default {LAYERS}: 0.415B)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds of every tool (default 3)")
    parser.add_argument("--out", type=Path, help="write results.json here")
    parser.add_argument("--baseline", type=Path, help="a source tree of an older zero_kit: measure its export too")
    args = parser.parse_args(argv)
    checkpoint = prepare(args.work, args.layers)
    out = args.work / "exports"
    commands = tools(checkpoint, out, args.baseline)
    measure(*commands["zero-kit export"])  # warm the page cache, untimed
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    for repeat in range(args.repeats):
        names = list(commands) if repeat % 2 == 0 else list(reversed(commands))
        for name in names:
            runs[name].append(measure(*commands[name]))
            print(f"round {repeat + 1} {name}: {runs[name][-1]}", flush=True)
    equal = {name: same_tensors(out / "zero_to_fp32", commands[name][1]) for name in commands}
    result = summarize(runs, equal, checkpoint, args.layers)
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


def summarize(runs: dict, equal: dict, checkpoint: Path, layers: int) -> dict:
    config = json.loads((checkpoint.parent.parent / "model" / "config.json").read_text())
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    parameters = layers * (4 * hidden * hidden + 3 * hidden * inner + 2 * hidden) + hidden + 2 * vocab * hidden
    base = runs["zero_to_fp32.py"]
    ref_rss = statistics.median(r["tree_peak_rss_mib"] for r in base)
    ref_wall = statistics.median(r["wall_s"] for r in base)
    summary = {}
    for name, rows in runs.items():
        rss, wall = (
            statistics.median(r["tree_peak_rss_mib"] for r in rows),
            statistics.median(r["wall_s"] for r in rows),
        )
        summary[name] = {
            "median_peak_rss_mib": rss, "median_wall_s": wall, "rss_vs_zero_to_fp32": round(rss / ref_rss, 2),
            "wall_vs_zero_to_fp32": round(wall / ref_wall, 2), "tensors_equal_to_zero_to_fp32": equal[name],
        }  # fmt: skip
    sizes = sorted(checkpoint.glob("global_step*/*"))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shape": SHAPE, "layers": layers,
        "parameters": parameters, "train": TRAIN,
        "checkpoint_files_mib": {p.name: round(p.stat().st_size / 2**20) for p in sizes},
        "versions": versions(), "summary": summary, "runs": runs,
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())

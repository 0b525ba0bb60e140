"""Suite part g: ZeRO++ qwZ/qgZ and DeepSpeed's bf16 low-precision states, through the public CLI.

On CUDA: `zero-kit config --hf-auto` writes the configs, `zero-kit train --ds-config` runs each (embedded model,
one GPU, bf16, 20 steps, under the deepspeed launcher) beside a plain ZeRO-3 run; each run's losses are reported
against that run's (qwZ quantizes weights to int8 and qgZ gradients to int4, so they differ: reported, never
asserted). hpZ needs at least 2 ranks (its size must divide the world size): on one GPU it is left to the bench
strategies in parts_bench.ZEROPP_STRATEGIES, which this part also runs once zero_kit.strategies has them.

Without CUDA: qwZ/qgZ must be refused before any work with a message that says why, by `zero-kit config --device
cpu` and by a CPU `zero-kit train --ds-config`; the part records both refusals (status skipped) and fails if
either one is missing.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from benchmarks.gpu.common import Context, run_strategies, summarize_run
from benchmarks.gpu.parts_bench import ZEROPP_STRATEGIES, model_dir
from benchmarks.gpu.parts_train import train_run

CONFIGS = {
    "qwz_qgz": ["--quantized-weights", "--quantized-gradients"],
    "bf16_states": ["--bf16-master-weights", "--bf16-optimizer-states", "--torch-autocast"],
}
"""`zero-kit config --stage 3 --hf-auto` flags of each run beside plain ZeRO-3."""
REFUSAL = "not been implemented on CPU backend"
"""What both refusals quote: the error DeepSpeed itself gives on CPU."""


def _config(ctx: Context, name: str, flags: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    path = ctx.out / "zeropp" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "zero_kit.cli", "config", "--stage", "3", "--hf-auto", *flags, "-o", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120), str(path)


def _rel_diff(losses: list[float], reference: list[float]) -> float | None:
    pairs = list(zip(losses, reference, strict=False))
    return max((abs(a - b) / max(abs(b), 1e-12) for a, b in pairs), default=None)


def _cpu_refusals(ctx: Context) -> dict[str, Any]:
    """qwZ/qgZ on CPU: refused by the generator when told the target is CPU, and by a CPU training run."""
    told, _ = _config(ctx, "qwz_cpu", [*CONFIGS["qwz_qgz"], "--device", "cpu"])
    made, path = _config(ctx, "qwz_qgz", CONFIGS["qwz_qgz"])
    run = train_run(ctx, "zeropp_qwz_cpu", ["--ds-config", path]) if made.returncode == 0 else {"exit_code": None}
    log_path = ctx.out / "train" / "zeropp_qwz_cpu.log"
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else made.stderr
    return {
        "config_device_cpu": {"exit_code": told.returncode, "refused": told.returncode == 2 and REFUSAL in told.stderr,
                              "message": told.stderr.strip()[-600:]},
        "train_on_cpu": {"exit_code": run["exit_code"], "refused": run["exit_code"] == 2 and REFUSAL in log,
                         "message": "\n".join(line for line in log.splitlines() if "zero_quantized" in line)[-600:]},
    }  # fmt: skip


def zeropp(ctx: Context) -> tuple[str, str | None, dict]:
    """Part g: qwZ/qgZ and the bf16 states on one GPU against plain ZeRO-3; on CPU, their refusal."""
    if not ctx.cuda:
        refusals = _cpu_refusals(ctx)
        data = {"strategies": ZEROPP_STRATEGIES, "cpu_refusal": refusals}
        missing = [name for name, r in refusals.items() if not r["refused"]]
        if missing:
            return "failed", f"qwZ/qgZ not refused on CPU by: {missing}", data
        return "skipped", "skipped: no CUDA (qwZ/qgZ refused on CPU with the reason, as they must be)", data
    reference = train_run(ctx, "zeropp_zero3", ["--stage", "3"])
    runs: dict[str, Any] = {"zero3": reference}
    for name, flags in CONFIGS.items():
        made, path = _config(ctx, name, flags)
        if made.returncode != 0:
            runs[name] = {"exit_code": None, "config_error": made.stderr[-1500:]}
            continue
        runs[name] = train_run(ctx, f"zeropp_{name}", ["--ds-config", path])
        runs[name]["max_rel_loss_diff_vs_zero3"] = _rel_diff(runs[name]["losses"], reference["losses"])
    data: dict[str, Any] = {"strategies": ZEROPP_STRATEGIES, "train_runs": runs}
    if ZEROPP_STRATEGIES:
        records = run_strategies(ctx, "zeropp", ["zero3", *ZEROPP_STRATEGIES], nproc=1, precision="bf16",
                                 model=str(model_dir(ctx)), seq_len=2048, micro_batch=1, steps=10, warmup=4)  # fmt: skip
        data["runs"] = [summarize_run(r) for r in records]
    failed = [name for name, run in runs.items() if run["exit_code"] != 0]
    return ("failed", f"runs that did not finish: {failed}", data) if failed else ("ok", None, data)

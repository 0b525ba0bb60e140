"""Suite part: the performance issue's sweep on the GPU, at the throughput part's model, sequence and micro batch.
Each setting is a `zero-kit bench --zero-override` run of ZeRO-2/3 beside the generator's own (the throughput
part's runs): today's HF "auto" buckets, the CPU ranks' persistence threshold of 0, gathering decoder layers as one
(leaf_module, alone and with a layer's prefetch), DeepSpeed's default reduce bucket. Settings go in order of value
and each starts only while the budget lasts. The dry run (CPU) checks every setting's override against DeepSpeed's own
zero_optimization model (a key it does not know, or a value of the wrong type, fails there), so the first GPU minute
meets no typo, and launches the settings of DRY_LAUNCHED on the tiny shape, fp32: between them every code path of
the part (ZeRO-2 and ZeRO-3 beside the generated runs, a leaf module by its class name, the ratio to the generated
run). A launch is the fixed cost of a CI minute; the others differ from those only in numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.gpu.common import Context, run_strategies, summarize_run

SETTINGS: list[tuple[str, list[str], str]] = [
    ("hf_auto_h2", ["zero2", "zero3"], "reduce_bucket_size={h2},stage3_prefetch_bucket_size={p9},overlap_comm=true"),
    ("persistence_0", ["zero3"], "stage3_param_persistence_threshold=0"),
    ("leaf_decoder_layer", ["zero3"], 'leaf_module={{"classes":["{layer}"]}}'),
    (
        "leaf_prefetch_layer",
        ["zero3"],
        'leaf_module={{"classes":["{layer}"]}},stage3_prefetch_bucket_size={p25},'
        "stage3_param_persistence_threshold=0,memory_efficient_linear=false",
    ),
    ("reduce_5e8", ["zero2"], "reduce_bucket_size=500000000"),
]
"""(label, strategies, --zero-override template): h2 = h², p9 = 0.9·h² (what the HF Trainer fills "auto" with),
p25 = 25·h² (a whole decoder layer ahead), layer = the decoder layer's class. persistence_0 is the CPU ranks' rule
(nothing kept whole, no gather after the step) on the GPU, where the generator keeps 10·h; leaf_prefetch_layer is
the fastest ZeRO-3 measured on CPU ranks (benchmarks/comm_buckets)."""
DRY_LAUNCHED = ("hf_auto_h2", "leaf_prefetch_layer")
"""The settings the dry run launches; every other one is checked without a launch (check_override)."""
RESERVE_S = 90
"""A setting starts only with this many seconds of the suite's budget left."""


def override(template: str, model_config: dict) -> str:
    h = model_config["hidden_size"]
    layer = model_config["architectures"][0].removesuffix("ForCausalLM") + "DecoderLayer"
    return template.format(h2=h * h, p9=int(0.9 * h * h), p25=25 * h * h, layer=layer)


def check_override(text: str, strategy: str) -> str:
    """`text` parsed as the bench parses --zero-override, then given to DeepSpeed's DeepSpeedZeroConfig at the
    strategy's stage: what a launch would do with it before its first step. Raises on what DeepSpeed refuses."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from zero_kit.bench.options import parse_zero_override
    from zero_kit.strategies import check_name

    DeepSpeedZeroConfig(stage=check_name(strategy).stage, **parse_zero_override(text))
    return "accepted by DeepSpeedZeroConfig"


def sweep(ctx: Context) -> tuple[str, str | None, dict]:
    setting = ctx.results.get("throughput_setting")
    generated = {r["strategy"]: summarize_run(r) for r in ctx.results.get("throughput_records", [])}
    if not setting or not generated:
        return "skipped", "skipped: no throughput runs to compare with (the throughput part did not run)", {}
    config = json.loads((Path(setting["model"]) / "config.json").read_text(encoding="utf-8"))
    steps = {"steps": 3, "warmup": 1} if ctx.dry_run else {"steps": 10, "warmup": 4, "timeout": 300}
    runs: list[dict[str, Any]] = []
    not_run = []
    for label, strategies, template in SETTINGS:
        if ctx.remaining() < RESERVE_S:
            not_run.append(label)
            continue
        text = override(template, config)
        if ctx.dry_run and label not in DRY_LAUNCHED:
            runs += [{"setting": label, "zero_override": text, "strategy": name, "checked": check_override(text, name)}
                     for name in strategies]  # fmt: skip
            continue
        records = run_strategies(ctx, f"sweep_{label}", strategies, nproc=1, precision=setting["precision"],
                                 model=setting["model"], seq_len=setting["seq_len"],
                                 micro_batch=setting["micro_batch"], zero_override=text, **steps)  # fmt: skip
        for record in records:
            run = {"setting": label, "zero_override": text, **summarize_run(record)}
            base = generated.get(run["strategy"])
            if base and not base.get("failed") and not run.get("failed"):
                run["vs_generated_tokens_per_s"] = run["tokens_per_s"] / base["tokens_per_s"]
            runs.append(run)
    data = {"setting": setting, "runs": runs, "not_run_budget": not_run}
    failed = [f"{r['setting']}:{r['strategy']}" for r in runs if r.get("failed")]
    if failed:
        return "failed", f"failed runs: {failed}", data
    return ("ok", None, data) if runs else ("skipped", f"skipped: budget spent before {not_run}", data)

"""The GPU suite's CPU dry mode: `python -m benchmarks.gpu.suite --dry-run --out DIR` runs every part that needs
no CUDA with tiny shapes (real launches: torchrun DDP and deepspeed ZeRO-3; `zero-kit train` ZeRO-3 + export +
reload + resume and LoRA; the throughput part at the planner's micro batch and the sweep's DRY_LAUNCHED
settings, every other setting checked against DeepSpeed's zero_optimization model), and
every part writes one schema-valid record: the other CUDA parts say `skipped: no CUDA`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu.common import PART_DATA_KEYS, check_record
from benchmarks.gpu.parts_sweep import DRY_LAUNCHED, SETTINGS, check_override
from benchmarks.gpu.suite import PARTS

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_writes_one_valid_record_per_part(tmp_path):
    out = tmp_path / "gpu_dry"
    # The 9-minute budget is the GPU machine's; 2 loaded CPU cores take 5-7 minutes for the dry run, so a part must
    # not be skipped for time here: every part's record is what this test checks.
    argv = [sys.executable, "-m", "benchmarks.gpu.suite", "--dry-run", "--budget-min", "60", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "suite.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["part"] for r in records] == [name for name, _ in PARTS] == list(PART_DATA_KEYS)
    for record in records:
        assert check_record(record) == [], record["part"]
        assert record["dry_run"] and record["versions"]["torch"] and record["hardware"]["cpus"]
    by = {r["part"]: r for r in records}
    for part in ("environment", "train", "throughput", "sweep", "correctness", "long"):  # CPU's parts ran, passed
        assert by[part]["status"] == "ok", (part, by[part]["reason"], by[part]["data"].get("traceback"))
    for part in ("planner", "compile"):
        assert by[part]["status"] == "skipped" and "no CUDA" in by[part]["reason"]
    throughput = by["throughput"]["data"]  # the micro batch is the planner's: the tiny shape fits 8 on 80 GB
    assert throughput["micro_batch"] == 8 and all(throughput["planned_fits"]["8"].values())
    assert [(r["strategy"], r["batch"]["micro"]) for r in throughput["runs"]] == [("ddp", 8), ("zero3", 8)]
    sweep = by["sweep"]["data"]  # every setting the GPU will run: the launched ones at the throughput part's batch
    assert [(r["setting"], r["strategy"]) for r in sweep["runs"]] == [
        (label, strategy) for label, strategies, _ in SETTINGS for strategy in strategies
    ]
    launched = [r for r in sweep["runs"] if r["setting"] in DRY_LAUNCHED]
    assert {r["strategy"] for r in launched} == {"zero2", "zero3"} and all(r["batch"]["micro"] == 8 for r in launched)
    assert all(r["vs_generated_tokens_per_s"] > 0 for r in launched if r["strategy"] == "zero3")  # beside throughput's
    assert all(r["checked"] == "accepted by DeepSpeedZeroConfig" for r in sweep["runs"] if r not in launched)
    leaf = json.loads((out / "bench" / "sweep_leaf_prefetch_layer" / "results.jsonl").read_text().splitlines()[0])
    assert leaf["leaf_modules"] == {"LlamaDecoderLayer": 2}  # what DeepSpeed's engine applied from the override
    train = by["train"]["data"]["runs"]
    assert train["zero3_resumed"]["resumed_from"].endswith("checkpoint-2") and train["zero3_resumed"]["losses"]
    assert train["lora"]["adapter_files"] and "zero3_offload" not in train  # CPU Adam's op build: CUDA runs only
    assert "zero2" not in train  # ZeRO-3's code path with another --stage: the GPU's run only
    zeropp = by["zeropp"]  # qwZ/qgZ are CUDA-only: on CPU the generator (told so) and a train run refuse them
    assert zeropp["status"] == "skipped" and "refused" in zeropp["reason"], (zeropp["reason"], zeropp["data"])
    assert all(r["refused"] and "CPU backend" in r["message"] for r in zeropp["data"]["cpu_refusal"].values())
    long = by["long"]["data"]  # issue 48: every variant planned for ZeRO-3, the longer the more flags; one trained
    planned = {name: row["seq_len"] for name, row in long["planned"].items()}
    assert long["strategy"] == "zero3" and all(row["limit_terms"] for row in long["planned"].values())
    assert 0 < planned["plain"] < planned["checkpointing"] < planned["checkpointing+tiled"], planned
    assert planned["plain"] < planned["tiled"] < planned["checkpointing+tiled"], planned
    runs = [run for v in long["variants"].values() for run in v["runs"]]
    assert [(run["length"], run["trained"]) for run in runs] == [(256, True)], runs
    assert "--tiled-compute" in runs[0]["command"] and "--no-memory-check" in runs[0]["command"]
    correctness = by["correctness"]["data"]
    assert {r["strategy"] for r in correctness["runs"]} == {"ddp", "zero3"} and all(
        correctness["within_tolerance"].values()
    )
    zero3 = next(r for r in correctness["runs"] if r["strategy"] == "zero3")
    assert zero3["optimizer"]["client_optimizer"]  # read from DeepSpeed's INFO log: torch AdamW passed in
    assert by["train"]["data"]["runs"]["zero3"]["reload"]["ok"]
    assert by["environment"]["data"]["matmul"]["tflops"] > 0
    assert (out / "summary.md").exists() and (out / "correctness.png").exists()
    # the planner reads this very file: a dry run measured no GPU constant, and it says so
    plan = subprocess.run([sys.executable, "-m", "zero_kit.cli", "plan", "--params", "1e9", "--gpu-mem", "80GB",
                           "--gpu-record", str(out / "suite.jsonl")], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)  # fmt: skip
    assert plan.returncode == 2 and "--gpu-record" in plan.stderr and "did not measure (skipped" in plan.stderr


def test_a_sweep_override_deepspeed_refuses_fails_its_check():
    assert check_override("stage3_param_persistence_threshold=0", "zero3") == "accepted by DeepSpeedZeroConfig"
    with pytest.raises(Exception, match="stage3_param_persistance_threshold"):  # misspelt: the bench's own check
        check_override("stage3_param_persistance_threshold=0", "zero3")
    with pytest.raises(Exception, match="reduce_bucket_size"):  # a value DeepSpeed's model refuses
        check_override("reduce_bucket_size=[1]", "zero2")


def test_schema_check_names_what_is_wrong():
    good = {"part": "throughput", "status": "skipped", "reason": "skipped: no CUDA", "wall_s": 0.0,
            "dry_run": True, "data": {}, "versions": {}, "hardware": {}}  # fmt: skip
    assert check_record(good) == []
    assert check_record({**good, "status": "ok"}) == [f"throughput: data.{k} missing" for k in
                                                      PART_DATA_KEYS["throughput"]]  # fmt: skip
    assert check_record({**good, "reason": None}) == ["throughput: status skipped without a reason"]
    assert check_record({**good, "wall_s": None}) == ["wall_s: missing or not <class 'float'>"]

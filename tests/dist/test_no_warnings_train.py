"""No warnings of our own: a 1-rank `zero-kit train` (LoRA, so peft's path runs too; with an evaluation) records every warning raised
in its process and none is one that zero_kit's own code or arguments cause. Library warnings about the libraries'
own internals are theirs and may come and go between releases; these are the ones a user could only fix in our
code (a deprecated keyword we pass, a deprecated attribute read on our behalf, a warning raised in zero_kit/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import FAST, env

pytestmark = pytest.mark.dist

# Messages of deprecations that zero_kit's calls trigger (transformers >= 5.23 renamed gradient checkpointing to
# activation checkpointing: TrainingArguments(gradient_checkpointing=...) and model.is_gradient_checkpointing).
OURS = ("`gradient_checkpointing` is deprecated", "`is_gradient_checkpointing` is deprecated")
PACKAGE = str(Path(__file__).resolve().parents[2] / "zero_kit")

RECORDER = """
import json, sys, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    from zero_kit.cli import main
    code = main(sys.argv[2:])
records = [{"category": w.category.__name__, "message": str(w.message), "filename": w.filename} for w in seen]
json.dump({"code": code, "warnings": records}, open(sys.argv[1], "w"))
"""


def own(records: list[dict], package: str) -> list[dict]:
    import zero_kit

    installed = str(Path(zero_kit.__file__).parent)
    return [
        r
        for r in records
        if r["category"] in ("FutureWarning", "DeprecationWarning")
        and (r["message"].startswith(OURS) or r["filename"].startswith((package, installed)))
    ]


def test_a_one_rank_lora_train_raises_no_warning_of_ours(tmp_path):
    report = tmp_path / "warnings.json"
    args = ["train", "--stage", "2", "--max-steps", "1", "--lora-r", "4", "--output", str(tmp_path / "run"), *FAST]
    args += ["--val-size", "0.05"]  # the Trainer's evaluate() too, with our eval arguments
    proc = subprocess.run(
        [sys.executable, "-c", RECORDER, str(report), *args], capture_output=True, text=True, timeout=300, env=env()
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["code"] == 0
    assert not own(result["warnings"], PACKAGE), json.dumps(own(result["warnings"], PACKAGE), indent=1)


def test_the_recorder_would_see_ours():
    """The filter is not vacuous: the deprecation transformers >= 5.23 raises for our old keyword counts as ours."""
    records = [
        {"category": "FutureWarning", "message": "`gradient_checkpointing` is deprecated and will be removed in v6.",
         "filename": "/site-packages/transformers/training_args.py"},
        {"category": "DeprecationWarning", "message": "x", "filename": f"{PACKAGE}/train/rank.py"},
        {"category": "UserWarning", "message": "`gradient_checkpointing` is deprecated", "filename": "/x.py"},
        {"category": "FutureWarning", "message": "their own internals", "filename": "/site-packages/torch/x.py"},
    ]  # fmt: skip
    assert [r["filename"] for r in own(records, PACKAGE)] == [records[0]["filename"], records[1]["filename"]]

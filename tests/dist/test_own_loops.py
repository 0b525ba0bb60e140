"""Users' own training loops on zero_kit's generated configs (issue 37), two CPU ranks each, no Trainer: an
accelerate loop (own_loop_accelerate.py: its own AdamW and scheduler through `Accelerator.prepare`) under
`accelerate launch` with the JSON and YAML of `zero-kit config --accelerate-yaml`, and a `deepspeed.initialize` loop
(own_loop_deepspeed.py) under the `deepspeed` launcher with the JSON of plain `zero-kit config`; ZeRO-2 and ZeRO-3
with CPU offload, the configs exactly as the user's command writes them (ZeRO-3 without offload partitions the same
way: a user's own script runs it in test_third_party_clients.py, and zero-kit's loop in every ZeRO-3 train test).

Each run: exit 0, DeepSpeed on, two ranks that each read their own half of the rows, a falling loss, and saved
weights with no empty tensor that plain transformers loads. Each launch takes 7-12 s on 2 cores (no zero-kit
start-up in it). `zero-kit validate` on each config with the script says no error (its consumer rules are in
tests/unit/test_validate_consumers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.jobs import VENV_BIN, run, zero_kit
from tests.support.runs import assert_saved, tiny_model_dir

pytestmark = pytest.mark.dist
HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "zero_kit" / "assets" / "data" / "text.jsonl"
CONFIGS = {
    "zero2": ["--stage", "2"],
    "zero3_offload": ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"],
}
PORTS = {("accelerate", "zero2"): 29740, ("accelerate", "zero3_offload"): 29742,
         ("deepspeed", "zero2"): 29743, ("deepspeed", "zero3_offload"): 29745}  # fmt: skip
WORLD, MICRO, STEPS = 2, 2, 4
# The user's command of the issue: no flag beyond these, no hand edit (the deepspeed loop's leaves out the YAML).
USER = ["--world-size", str(WORLD), "--micro-batch", str(MICRO), "--device", "cpu"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The embedded tiny LLaMA and the shipped tokenizer as a model directory, written once for every run."""
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_llama"))


def _launch(launcher: str, name: str, tmp_path: Path, model_dir: Path) -> tuple[Path, Path]:
    cfg, yaml, out = tmp_path / f"{name}.json", tmp_path / f"{name}.yaml", tmp_path / "out"
    job = ["--model_dir", str(model_dir), "--data_file", str(DATA), "--output_dir", str(out)]
    port = str(PORTS[launcher, name])
    if launcher == "accelerate":
        run(zero_kit("config", *CONFIGS[name], *USER, "--precision", "fp32", "--accelerate-yaml", str(yaml),
                     "-o", str(cfg)))  # fmt: skip
        script = HERE / "own_loop_accelerate.py"
        cmd = [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(yaml), "--main_process_port", port]
        run([*cmd, str(script), *job, "--max_steps", str(STEPS), "--micro_batch", str(MICRO)])
    else:
        run(zero_kit("config", *CONFIGS[name], *USER, "-o", str(cfg)))  # --device cpu: fp32 by default
        script = HERE / "own_loop_deepspeed.py"
        cmd = [str(VENV_BIN / "deepspeed"), "--num_gpus", str(WORLD), "--master_port", port]
        run([*cmd, str(script), *job, "--max_steps", str(STEPS), "--deepspeed_config", str(cfg)])
    return cfg, out


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("launcher", ["accelerate", "deepspeed"])
def test_own_loop_trains_on_the_generated_config(tmp_path, model_dir, launcher, name):
    cfg, out = _launch(launcher, name, tmp_path, model_dir)
    config = json.loads(cfg.read_text())
    assert config["bf16"]["enabled"] is False and config["fp16"]["enabled"] is False  # --device cpu: fp32
    assert ("optimizer" in config) == (launcher == "deepspeed")  # accelerate refuses one beside the loop's own
    seen = [json.loads((out / f"rows_{rank}.json").read_text()) for rank in range(WORLD)]
    assert [(s["world"], s["index"]) for s in seen] == [(WORLD, 0), (WORLD, 1)]
    if launcher == "accelerate":
        assert {s["distributed_type"] for s in seen} == {"DEEPSPEED"}
    halves = [set(s["rows"]) for s in seen]
    assert all(len(h) == STEPS * MICRO for h in halves) and not halves[0] & halves[1], halves
    losses = json.loads((out / "losses.json").read_text())
    assert len(losses) == STEPS and losses[-1] < losses[0], losses
    assert_saved(out, model_dir)
    script = HERE / f"own_loop_{launcher}.py"
    checked = run(zero_kit("validate", str(cfg), "--for", launcher, "--script", str(script), "--world-size", "2"))
    assert "OK (0 error(s)" in checked.stdout, checked.stdout

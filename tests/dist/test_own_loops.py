"""Users' own training loops on zero_kit's generated configs (issue 37), two CPU ranks each, no Trainer: an
accelerate loop (own_loop_accelerate.py: its own AdamW and scheduler through `Accelerator.prepare`) under
`accelerate launch` with the JSON and YAML of `zero-kit config --accelerate-yaml`, and a `deepspeed.initialize` loop
(own_loop_deepspeed.py) under the `deepspeed` launcher with the JSON of plain `zero-kit config`; ZeRO-2 and ZeRO-3
with CPU offload, the configs exactly as the user's command writes them (ZeRO-3 without offload partitions the same
way: a user's own script runs it in test_third_party_clients.py, and zero-kit's loop in every ZeRO-3 train test).

Each run: exit 0, DeepSpeed on, two ranks that each read their own half of the rows, a falling loss, and saved
weights with no empty tensor that plain transformers loads. The accelerate loop takes one launch per config (the
YAML is the launch's: it sets accelerate's DeepSpeed plugin for the whole process); the deepspeed loop trains both
configs in one launch, one engine after the other in the same ranks (its --then), as preset_steps.py does. Each
launch takes 7-12 s on 2 cores (no zero-kit start-up in it). `zero-kit validate` on each launcher's two configs with
the script (one call for both) says no error (its consumer rules are in tests/unit/test_validate_consumers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.jobs import VENV_BIN, run, shm_left, zero_kit
from tests.support.runs import assert_saved, tiny_model_dir

pytestmark = pytest.mark.dist
HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "zero_kit" / "assets" / "data" / "text.jsonl"
CONFIGS = {
    "zero2": ["--stage", "2"],
    "zero3_offload": ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"],
}
ACCELERATE_PORTS, DEEPSPEED_PORT = {"zero2": 29740, "zero3_offload": 29742}, 29743  # one deepspeed launch for both
WORLD, MICRO, STEPS = 2, 2, 4
# The user's command of the issue: no flag beyond these, no hand edit (the deepspeed loop's leaves out the YAML).
USER = ["--world-size", str(WORLD), "--micro-batch", str(MICRO), "--device", "cpu"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The embedded tiny LLaMA and the shipped tokenizer as a model directory, written once for every run."""
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_llama"))


def _launch(launcher: str, tmp_path: Path, model_dir: Path) -> dict[str, tuple[Path, Path]]:
    """Each config of CONFIGS as the user's command writes it, trained by the launcher's own loop: its config file
    and output directory by name."""
    runs = {name: (tmp_path / f"{name}.json", tmp_path / name) for name in CONFIGS}

    def job(out: Path) -> list[str]:
        return ["--model_dir", str(model_dir), "--data_file", str(DATA), "--output_dir", str(out), "--max_steps",
                str(STEPS)]  # fmt: skip

    if launcher == "accelerate":  # a launch per config: its YAML sets the launch's DeepSpeed plugin
        for name, (cfg, out) in runs.items():
            yaml = tmp_path / f"{name}.yaml"
            run(zero_kit("config", *CONFIGS[name], *USER, "--precision", "fp32", "--accelerate-yaml", str(yaml),
                         "-o", str(cfg)))  # fmt: skip
            port = str(ACCELERATE_PORTS[name])
            cmd = [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(yaml), "--main_process_port", port]
            run([*cmd, str(HERE / "own_loop_accelerate.py"), *job(out), "--micro_batch", str(MICRO)])
        return runs
    for name, (cfg, _) in runs.items():
        run(zero_kit("config", *CONFIGS[name], *USER, "-o", str(cfg)))  # --device cpu: fp32 by default
    # one launch: the first config, then each other one (--then CONFIG OUTPUT_DIR) in the same two ranks
    (cfg, out), *more = runs.values()
    then = [item for other_cfg, other_out in more for item in ("--then", str(other_cfg), str(other_out))]
    cmd = [str(VENV_BIN / "deepspeed"), "--num_gpus", str(WORLD), "--master_port", str(DEEPSPEED_PORT)]
    run([*cmd, str(HERE / "own_loop_deepspeed.py"), *job(out), "--deepspeed_config", str(cfg), *then])
    return runs


@pytest.fixture(scope="module", params=["accelerate", "deepspeed"])
def launched(request, tmp_path_factory, model_dir) -> tuple[str, dict[str, tuple[Path, Path]], str]:
    """The launcher, its runs of every config (config file, output directory) and what `zero-kit validate` said of
    its configs with its script."""
    launcher = request.param
    runs = _launch(launcher, tmp_path_factory.mktemp(launcher), model_dir)
    script = HERE / f"own_loop_{launcher}.py"
    configs = [str(cfg) for cfg, _ in runs.values()]
    checked = run(zero_kit("validate", *configs, "--for", launcher, "--script", str(script), "--world-size", "2"))
    left = shm_left(*(ACCELERATE_PORTS.values() if launcher == "accelerate" else [DEEPSPEED_PORT]))
    assert left == [], f"the loop's one line did not keep DeepSpeed's shm op from leaving {left}"
    return launcher, runs, checked.stdout


@pytest.mark.parametrize("name", CONFIGS)
def test_own_loop_trains_on_the_generated_config(launched, model_dir, name):
    launcher, runs, validated = launched
    cfg, out = runs[name]
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
    assert f"{cfg}: OK (0 error(s)" in validated, validated

"""Third-party clients on zero_kit's generated configs, two CPU ranks each, none of them written here (issue 22):
TRL's `trl sft` command line (TRL launches through `accelerate launch --config_file`, its documented way) and a
user's own Trainer script (hf_trainer_script.py: transformers' HfArgumentParser + Trainer, no zero_kit import)
under `accelerate launch`, both with the YAML `zero-kit config --accelerate-yaml` writes, for ZeRO-2, ZeRO-3 and
ZeRO-3 with CPU offload; and `accelerate test` on that YAML, which cannot pass on a CPU-only host (see its test).

Each run: exit 0, two ranks that each read their half of the data, a falling loss, and saved weights with no
empty tensor that transformers loads without DeepSpeed. On CPU the scripts get `--use_cpu` (TrainingArguments):
without it accelerate finds no device backend and every rank acts as rank 0 of a world of one."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.jobs import VENV_BIN, env, run, zero_kit
from tests.support.runs import assert_saved, tiny_model_dir

# serial: a rank of `trl sft` on ZeRO-3 aborts at exit ("terminate called without an active exception", after
# training and its save) more often when another launcher test shares the 2 cores (CI run of d0fb5c3; once alone,
# 2026-11-27). The abort is torch's and tolerated after a whole save (test_trl_sft); a neighbour's load could still
# make the launcher end rank 0 during its save.
pytestmark = [pytest.mark.dist, pytest.mark.serial]
ASSETS = Path(__file__).resolve().parents[2] / "zero_kit" / "assets" / "data"
SCRIPT = Path(__file__).with_name("hf_trainer_script.py")
CONFIGS = {
    "zero2": ["--stage", "2"],
    "zero3": ["--stage", "3"],
    "zero3_offload": ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"],
}
PORTS = {"zero2": 29664, "zero3": 29665, "zero3_offload": 29666}  # this module's own; 29667: accelerate test
WORLD, MICRO, STEPS = 2, 2, 4
TRAINING_ARGS = [
    "--use_cpu",  # TrainingArguments: gloo for two CPU processes, DeepSpeed still on (see the module docstring)
    *("--max_steps", str(STEPS), "--per_device_train_batch_size", str(MICRO), "--gradient_accumulation_steps", "1"),
    *("--learning_rate", "1e-3", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none"),
]
TORCH_EXIT_ABORT = "terminate called without an active exception"
# The Trainer's log line, printed by rank 0: {'loss': 7.5, ...} (transformers 4) or {'loss': '7.548', ...} (5).
LOG_VALUE = r"'{}': '?([-+0-9.eE]+)"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The embedded tiny LLaMA and the shipped tokenizer as a model directory, written once for every run."""
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_llama"))


def generate(tmp_path: Path, name: str) -> Path:
    """`zero-kit config` for a two-rank accelerate run, as a user makes one: the JSON and the YAML naming it."""
    cfg, yaml = tmp_path / f"{name}.json", tmp_path / f"{name}.yaml"
    batch = ["--world-size", str(WORLD), "--micro-batch", str(MICRO), "--grad-accum", "1"]
    run(zero_kit("config", *CONFIGS[name], "--hf-auto", *batch, "-o", str(cfg), "--accelerate-yaml", str(yaml)))
    return yaml


@pytest.mark.parametrize("name", CONFIGS)
def test_trl_sft(tmp_path, model_dir, name):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    shutil.copy(ASSETS / "chat.jsonl", data / "train.jsonl")  # TRL reads the conversational format as it is
    launch = ["--accelerate_config", str(generate(tmp_path, name)), "--main_process_port", str(PORTS[name])]
    job = ["--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--max_length", "64"]
    cmd = [str(VENV_BIN / "trl"), "sft", *launch, *job, "--output_dir", str(out), *TRAINING_ARGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env())
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        # torch's gloo abort at interpreter exit (docs/own_script.md, "exited 250"): `trl sft` never destroys its
        # process group, and a rank may die of SIGABRT after the save. Tolerated only in exactly that form, and only
        # if the save is whole (assert_saved below): anything else, or a save cut short, fails here.
        assert TORCH_EXIT_ABORT in text and "SIGABRT" in text and "Model saved" in text, text[-4000:]
        print(f"trl sft exited {proc.returncode}: torch's gloo abort at exit after the save (known, documented)")
    assert text.count("Training completed") == 1, "one main process"  # each rank prints it when both think so
    losses = [float(v) for v in re.findall(LOG_VALUE.format("loss"), text)]
    epochs = [float(v) for v in re.findall(LOG_VALUE.format("epoch"), text)]
    assert len(losses) == STEPS and losses[-1] < losses[0], losses
    # The sampler split the rows over two ranks: STEPS x MICRO x WORLD rows read (a world of one reads half).
    assert round(epochs[-1] * rows(ASSETS / "chat.jsonl")) == STEPS * MICRO * WORLD, epochs
    assert_saved(out, model_dir)


@pytest.mark.parametrize("name", CONFIGS)
def test_accelerate_launch_trainer_script(tmp_path, model_dir, name):
    out = tmp_path / "out"
    launch = [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(generate(tmp_path, name))]
    job = [str(SCRIPT), "--model_dir", str(model_dir), "--data_file", str(ASSETS / "text.jsonl")]
    run([*launch, "--main_process_port", str(PORTS[name]), *job, "--output_dir", str(out), *TRAINING_ARGS])
    seen = json.loads((out / "ranks.json").read_text())
    assert seen == {"world_size": WORLD, "process_index": 0, "deepspeed": True}
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [record["loss"] for record in state["log_history"] if "loss" in record]
    assert state["global_step"] == STEPS and len(losses) == STEPS and losses[-1] < losses[0], losses
    assert round(state["epoch"] * rows(ASSETS / "text.jsonl")) == STEPS * MICRO * WORLD, state["epoch"]
    assert_saved(out, model_dir)


def rows(data_file: Path) -> int:
    """Examples in a JSONL file: the Trainer's epoch is the share of them read so far, over all ranks."""
    return len(data_file.read_text(encoding="utf-8").splitlines())


def test_accelerate_test_cannot_run_deepspeed_on_a_cpu_only_host(tmp_path):
    """`accelerate test --config_file` the generated YAML fails on a CPU-only host, and no YAML can fix it.

    accelerate's test_script.py builds a bare `Accelerator()`. Its PartialState (accelerate/state.py) picks a
    process-group backend only for an accelerator device unless `cpu` is set; with none, DeepSpeed's
    init_distributed still joins the two ranks, but accelerate records the backend as None and so
    `num_processes = 1, process_index = 0` on every rank: both act as the main process and its
    main-process-first check fails. The one YAML setting for CPU, `use_cpu: true`, exports ACCELERATE_USE_CPU,
    which makes PartialState choose MULTI_CPU and AcceleratorState skip DEEPSPEED (`use deepspeed ... and not
    cpu`): it would pass, testing no DeepSpeed. The Trainer runs with both only because TrainingArguments(use_cpu)
    builds PartialState(cpu=True) itself before its Accelerator (see the other tests). On a GPU host the same
    YAML takes the device branch. If accelerate changes this, this test fails: make it a passing one then."""
    yaml = generate(tmp_path, "zero2")
    yaml.write_text(yaml.read_text() + "main_process_port: 29667\n")  # test_script runs on accelerate's default
    cmd = [str(VENV_BIN / "accelerate"), "test", "--config_file", str(yaml)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env(), cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert text.count("Distributed environment: DistributedType.DEEPSPEED") == WORLD, text[-3000:]
    assert text.count("Num processes: 1\n") == WORLD and "Num processes: 2" not in text, text[-3000:]

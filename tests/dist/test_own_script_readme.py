"""The README's "Your own Trainer script" example, run exactly as written (the code block and its launch line are
read from README.md, blocks `readme-own-script` and `readme-own-script-launch`, tests/support/docs.py) under the real
`deepspeed` launcher on two CPU ranks: the embedded tiny LLaMA saved as a model directory, the
shipped text data. Before `zero_kit.hf.training_arguments` the same kind of script failed there: zero.Init read the
config before DeepSpeed's communication was up, counted one rank and failed DeepSpeed's batch check."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.support import docs
from tests.support.jobs import TESTS, VENV_BIN, run
from tests.support.runs import load_safetensors_dir

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "zero_kit" / "assets" / "data" / "text.jsonl"
HELD_SITE = TESTS / "dist" / "held_probe"  # ZERO_KIT_PROBE_HELD: what each rank stores once the model is built
STEPS = 10


def _save_tiny_model(directory: Path) -> dict[str, torch.Tensor]:
    from zero_kit.model import load_model, load_tokenizer

    model = load_model()
    model.save_pretrained(directory)
    load_tokenizer().save_pretrained(directory)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def test_readme_example_runs_as_written_on_two_cpu_ranks(tmp_path):
    (tmp_path / "train.py").write_text(docs.covered("readme-own-script").text)
    initial = _save_tiny_model(tmp_path / "model")
    # the README's launch line, its placeholders made files: path/to/llama the tiny model, my.jsonl the shipped text
    line = docs.command("readme-own-script-launch")
    assert line[:4] == ["deepspeed", "--num_gpus", "2", "train.py"], line
    mine = {"path/to/llama": str(tmp_path / "model"), "my.jsonl": str(DATA)}
    launcher = [str(VENV_BIN / "deepspeed"), "--num_gpus", "2", "--master_port", "29645", "train.py"]
    job = [mine.get(word, word) for word in line[4:]] + ["--lr", "1e-3", "--max_steps", str(STEPS)]
    held = tmp_path / "held"
    held.mkdir()
    probe = {"HF_DATASETS_CACHE": str(tmp_path / "cache"), "ZERO_KIT_PROBE_HELD": str(held)}
    proc = run([*launcher, *job], cwd=tmp_path, timeout=300, extra_env=probe, site=HELD_SITE)
    # zero_kit.hf sends the libraries' deprecations of each other to a log: the same script under torchrun printed
    # 1,244 FutureWarnings before
    assert (proc.stdout + proc.stderr).count("FutureWarning") <= 5, proc.stderr[-3000:]
    # zero.Init built the model for two ranks: each stores half of it from the start
    records = [json.loads((held / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    total = sum(t.numel() for t in initial.values())
    assert [r["total"] for r in records] == [total, total]
    assert all(abs(r["stored"] - total / 2) < 0.01 * total for r in records), records

    out = tmp_path / "out"
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in steps] == list(range(1, STEPS + 1))
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.5, [entry["loss"] for entry in steps]
    # 84 rows, 4 per rank: 11 steps per epoch on two ranks (21 on one, as when both ranks act as rank 0)
    assert steps[0]["epoch"] == pytest.approx(1 / 11, abs=1e-3)
    assert len(re.findall(r"'tokens_per_s': '[0-9.]+'", proc.stdout + proc.stderr)) == STEPS  # ThroughputCallback

    saved = load_safetensors_dir(out)
    assert saved.keys() <= initial.keys() and saved, sorted(saved)
    assert all(tensor.numel() == initial[name].numel() > 0 for name, tensor in saved.items())
    assert any(not torch.equal(tensor, initial[name]) for name, tensor in saved.items())  # trained
    _loads_without_deepspeed(out)


def _loads_without_deepspeed(out: Path) -> None:
    """A fresh interpreter with DeepSpeed made unimportable loads the saved model and computes finite logits."""
    code = (
        "import sys; sys.modules['deepspeed'] = None\n"
        "import torch\nfrom transformers import AutoModelForCausalLM\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(out)!r}, dtype=torch.float32)\n"
        "logits = model(input_ids=torch.arange(3, 40).reshape(1, -1)).logits\n"
        "assert torch.isfinite(logits).all()\nprint('loaded', sum(p.numel() for p in model.parameters()))\n"
    )
    proc = run([str(VENV_BIN / "python"), "-c", code], timeout=120)
    assert proc.stdout.startswith("loaded 3")

"""The wheel, as a user gets it: `pip wheel --no-deps .` built, installed into fresh virtual environments (no source
tree on the path, started from a directory without one), and run end to end.

With the newest tested set (constraints/newest.txt): `zero-kit train --nproc 2 --stage 3 --max-steps 3` reaches an
exported Hugging Face directory, so the package data (tokenizer, chat template, datasets) is in the wheel. The oldest
supported set (constraints/oldest.txt) is CI's compatibility job: installed within setup.py's ranges (pip refuses a
set they exclude), then the unit tier and train/resume/bench runs on it. The test uses pip's cache and the index
pip is configured with; DeepSpeed's CPU ops come from the per-version build directory the other tests share
(benchmarks/rigs/base.py private_extensions_dir)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the README's CPU build
FAST = ["--max-length", "64", "--micro-batch", "2", "--log-steps", "1"]


def _run(cmd: list, *, timeout: int = 600, env: dict | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _pin(lock: str, name: str) -> str:
    text = (ROOT / "constraints" / f"{lock}.txt").read_text()
    return re.search(rf"^{name}==([\w.]+)$", text, re.M).group(1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    start = time.monotonic()
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", out, ROOT], timeout=300)
    (built,) = out.glob("zero_kit-*.whl")
    print(f"\nwheel built in {time.monotonic() - start:.0f} s")
    return built


def _outside_env() -> dict:
    """No PYTHONPATH: `python -m pip` run with the checkout on sys.path (PYTHONPATH, or the checkout as the current
    directory) sees its zero_kit.egg-info and skips the wheel as "already satisfied"."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _pip(python: Path, *args) -> None:
    _run([python, "-m", "pip", "install", "-q", *args], env=_outside_env(), cwd=python.parent)


def _venv(path: Path, *pip_args: str) -> Path:
    """A fresh environment (no system site-packages, so nothing of this checkout is visible) with torch first."""
    start = time.monotonic()
    _run([sys.executable, "-m", "venv", path])
    python = path / "bin" / "python"
    _pip(python, TORCH)
    _pip(python, *pip_args)
    print(f"\n{path.name}: installed in {time.monotonic() - start:.0f} s")
    return python


def _user_env(venv: Path, deepspeed_version: str) -> dict:
    """What a user's shell has: the venv's bin first, no PYTHONPATH; ops in the per-version build directory."""
    env = _outside_env()
    torch_version = subprocess.run(
        [venv / "bin" / "python", "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    extensions = (
        Path.home() / ".cache" / "zero_kit" / "torch_extensions" / f"torch{torch_version}-deepspeed{deepspeed_version}"
    )
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", TORCH_EXTENSIONS_DIR=str(extensions))
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def _assert_installed_from_the_wheel(python: Path, cwd: Path, env: dict) -> None:
    where = _run([python, "-c", "import zero_kit; print(zero_kit.__file__)"], env=env, cwd=cwd).strip()
    assert where.startswith(str(python.parent.parent)) and str(ROOT) not in where, where


def test_wheel_trains_zero3_to_an_export_in_a_fresh_environment(wheel, tmp_path):
    python = _venv(tmp_path / "venv-newest", wheel, "-c", ROOT / "constraints" / "newest.txt")
    work = tmp_path / "work"  # no source tree here
    work.mkdir()
    env = _user_env(tmp_path / "venv-newest", _pin("newest", "deepspeed"))
    _assert_installed_from_the_wheel(python, work, env)
    zero_kit = tmp_path / "venv-newest" / "bin" / "zero-kit"
    out = _run([zero_kit, "train", "--nproc", "2", "--stage", "3", "--max-steps", "3", "--master-port", "29640", *FAST],
               env=env, cwd=work)  # fmt: skip
    assert "step 3/3" in out
    final = work / "zero-kit-out" / "final"
    names = {p.name for p in final.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= names, names
    assert any(n.endswith(".safetensors") for n in names), names
    chat = "chat_template.jinja" in names or "chat_template" in (final / "tokenizer_config.json").read_text()
    assert chat, names
    check = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer; import sys; "
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(t.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False)); print(m.num_parameters())"
    )
    printed = _run([python, "-c", check, final], env=env, cwd=work)
    assert "hi" in printed and int(printed.split()[-1]) > 1_000_000

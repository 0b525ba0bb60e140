"""The wheel, as a user gets it: `pip wheel --no-deps .` built, installed on its own into a folder of its own
(`pip install --no-deps --target`: no source tree on the path, started from a directory without one), and run end to
end with the libraries of the newest tested set (constraints/newest.txt, this job's environment).

`zero-kit train --nproc 2 --stage 3 --max-steps 3` from the wheel's own console script reaches an exported Hugging
Face directory, so the package data (tokenizer, chat template, datasets) is in the wheel, and the wheel's own
requirements (its METADATA) admit every library it runs with. Resolving those requirements into a fresh environment
is what CI's install does with the same setup.py (and the compatibility job with the oldest set); a second fresh
environment here cost ~170 s of CI for the same resolution. DeepSpeed's CPU ops come from the per-version build
directory the other tests share (tests/rigs/base.py private_extensions_dir)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
FAST = ["--max-length", "64", "--micro-batch", "2", "--log-steps", "1"]


def _run(cmd: list, *, timeout: int = 600, env: dict | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


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


def _install(wheel: Path, target: Path) -> None:
    start = time.monotonic()
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel],
         env=_outside_env(), cwd=target.parent)  # fmt: skip
    print(f"\nwheel installed in {time.monotonic() - start:.0f} s")


def _user_env(target: Path) -> dict:
    """What a user's shell has: the wheel's scripts first, its package before anything else on the path (this job's
    editable install of the checkout is an import hook that Python asks only after the path), the libraries of this
    environment; DeepSpeed's ops from the build directory the suite prepared (TORCH_EXTENSIONS_DIR,
    tests/conftest.py)."""
    env = _outside_env()
    path = os.pathsep.join([str(target / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(PATH=path, PYTHONPATH=str(target), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def _requirements_admit_this_environment(target: Path) -> None:
    from importlib.metadata import PathDistribution, version

    from packaging.requirements import Requirement

    (info,) = target.glob("zero_kit-*.dist-info")
    requires = [Requirement(r) for r in PathDistribution(info).requires or []]
    runtime = [r for r in requires if r.marker is None]
    assert {"deepspeed", "transformers", "torch"} <= {r.name for r in runtime}, requires
    outside = {r.name: version(r.name) for r in runtime if version(r.name) not in r.specifier}
    assert not outside, f"the wheel's requirements exclude the versions it was tested with: {outside}"


def test_wheel_trains_zero3_to_an_export_in_a_user_directory(wheel, tmp_path):
    target = tmp_path / "site"
    _install(wheel, target)
    _requirements_admit_this_environment(target)
    work = tmp_path / "work"  # no source tree here
    work.mkdir()
    env = _user_env(target)
    where = _run([sys.executable, "-c", "import zero_kit; print(zero_kit.__file__)"], env=env, cwd=work).strip()
    assert where.startswith(str(target)) and str(ROOT) not in where, where
    zero_kit = target / "bin" / "zero-kit"
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
    printed = _run([sys.executable, "-c", check, final], env=env, cwd=work)
    assert "hi" in printed and int(printed.split()[-1]) > 1_000_000

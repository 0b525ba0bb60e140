"""The GPU wheelhouse really installs offline (too slow for CI: ~5 min on 2 busy cores, most of it pip). A fresh
venv holding only what the GPU image has (CPU torch 2.13 stands in for its CUDA torch; transformers 5.17,
accelerate, peft, pyarrow, ninja, numpy; no --system-site-packages), then
`pip install --no-index --find-links WHEELHOUSE zero_kit` with pip's config and indexes switched off, then
`import zero_kit, deepspeed, datasets` and `zero-kit plan`. Needs PyPI for the build. Run:

    python -m benchmarks.gpu.check_wheelhouse        # prints "wheelhouse OK" and exits 0

Measured 2026-11-23 on the 2-core CPU dev machine (Python 3.11.7, pip 23.2.1): passes, 4 min 50 s, 57.5 MiB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from benchmarks.gpu import wheelhouse

IMAGE = ["torch==2.13.0", "transformers==5.17.0", "accelerate", "peft", "pyarrow", "ninja", "numpy"]
ABSENT = ["deepspeed", "datasets", "hjson", "pydantic", "pydantic-core", "fsspec", "dill", "xxhash"]


def _run(cmd: list[str], env: dict | None = None, timeout: int = 600) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def check(tmp_path: Path) -> None:
    image = tmp_path / "image.txt"
    image.write_text("\n".join(IMAGE + [f"!{name}" for name in ABSENT]) + "\n", encoding="utf-8")
    house = tmp_path / "whl"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    code = wheelhouse.main(["--out", str(house), "--python-version", py, "--image", str(image)])
    assert code == 0
    names = {wheelhouse.canonical(p.name.split("-")[0]) for p in house.glob("*.whl")}
    assert {"zero-kit", "deepspeed", "datasets", "hjson", "pydantic", "pydantic-core"} <= names
    assert not names & {"torch", "pyarrow", "ninja"}, names  # what the image has is not carried

    env_dir = tmp_path / "image-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)  # no system site-packages: only what we install
    python = str(env_dir / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *IMAGE])
    offline = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}  # nothing but the wheelhouse
    _run([python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(house), "zero_kit"], offline)
    code = "import zero_kit, deepspeed, datasets, torch; print('VERSIONS', deepspeed.__version__, torch.__version__)"
    out = _run([python, "-c", code]).splitlines()[-1].split()  # DeepSpeed prints warnings on stdout first
    assert out[1] == "0.19.8" and out[2].startswith("2.13.0"), out
    _run([str(env_dir / "bin" / "zero-kit"), "plan", "--params", "1e9", "--gpu-mem", "80GB", "--json"])


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        check(Path(tmp))
    print("wheelhouse OK")

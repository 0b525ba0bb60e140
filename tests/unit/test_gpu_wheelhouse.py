"""The GPU wheelhouse: parsing, the size refusal, and the closure it builds (needs PyPI, ~1-2 min) resolved with NO
network against a fake image (metadata-only stub wheels for what the image has): `pip install --no-index
--dry-run --find-links WHEELHOUSE --find-links STUBS zero_kit`. The full fresh-venv install (~5 min) is
`python -m benchmarks.gpu.check_wheelhouse`."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.gpu import wheelhouse

IMAGE = ["torch==2.13.0", "transformers==5.17.0", "accelerate", "peft", "pyarrow", "ninja", "numpy"]
ABSENT = ["deepspeed", "datasets", "hjson", "pydantic", "pydantic-core", "fsspec", "dill", "xxhash"]


def test_image_file_and_pins_parse(tmp_path):
    path = tmp_path / "image.txt"
    path.write_text("torch==2.11.0  # cuda\nPyArrow\n!Pydantic_Core\n\n", encoding="utf-8")
    assert wheelhouse.read_image(path) == ({"torch": "2.11.0", "pyarrow": None}, {"pydantic-core"})
    pins = wheelhouse.exact_pins(["deepspeed==0.19.8", "torch<2.14,>=2.6", "peft[x]==0.21.2 ; python_version>'3'"])
    assert pins == {"deepspeed": "0.19.8", "peft": "0.21.2"}
    stub = wheelhouse.write_stub(tmp_path, "torch", "2.11.0+zkimage")
    assert stub.name == "torch-2.11.0+zkimage-py3-none-any.whl" and wheelhouse.wheel_requires(stub) == []


def test_refuses_a_wheelhouse_over_the_limit(tmp_path, monkeypatch, capsys):
    big = tmp_path / "big-1.0-py3-none-any.whl"
    big.write_bytes(b"\0" * (2 * 2**20))
    monkeypatch.setattr(wheelhouse, "build", lambda args: [big])
    assert wheelhouse.main(["--out", str(tmp_path), "--max-mib", "1"]) == 2
    assert "over the 1 MiB a copy to the GPU machine carries" in capsys.readouterr().err


def test_closure_installs_offline_into_a_fake_image(tmp_path):
    image = tmp_path / "image.txt"
    image.write_text("\n".join(IMAGE + [f"!{name}" for name in ABSENT]) + "\n", encoding="utf-8")
    house = tmp_path / "whl"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert wheelhouse.main(["--out", str(house), "--python-version", py, "--image", str(image)]) == 0
    names = {wheelhouse.canonical(p.name.split("-")[0]) for p in house.glob("*.whl")}
    assert {"zero-kit", "deepspeed", "datasets", "hjson", "pydantic", "pydantic-core"} <= names
    assert not names & {"torch", "pyarrow", "ninja"}, names  # what the image has is not carried

    stubs = tmp_path / "stubs"  # the fake image: what the builder assumed it has, minus what it ships newer
    stubs.mkdir()
    image_reqs = []
    for line in (house / "image-assumed.txt").read_text(encoding="utf-8").split():
        name, version = line.split("==")
        if name not in names:
            image_reqs.append(f"{name}=={wheelhouse.write_stub(stubs, name, version + '+zkimage').name.split('-')[1]}")
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index", "--report", "-",
           "--quiet", "--find-links", str(house), "--find-links", str(stubs), "zero_kit", *image_reqs]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env={"PIP_CONFIG_FILE": "/dev/null", "PATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"name": "deepspeed"' in done.stdout and '"name": "zero_kit"' in done.stdout

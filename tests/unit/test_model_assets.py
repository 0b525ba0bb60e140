"""The shipped tokenizer and datasets are exactly what scripts/make_assets.py builds, and stay small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "zero_kit" / "assets"


def shipped_files() -> dict[str, bytes]:
    return {str(p.relative_to(ASSETS)): p.read_bytes() for p in sorted(ASSETS.rglob("*")) if p.is_file()}


def test_assets_are_reproducible_from_the_script(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_assets.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rebuilt = {str(p.relative_to(tmp_path)): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    shipped = shipped_files()
    assert sorted(rebuilt) == sorted(shipped)
    for name, data in shipped.items():
        assert rebuilt[name] == data, f"{name} differs from a fresh run of scripts/make_assets.py"


def test_assets_are_small_and_complete():
    shipped = shipped_files()
    assert sum(len(data) for data in shipped.values()) < 2_000_000
    for name in ["tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json", "data/alpaca.jsonl", "data/chat.jsonl"]:
        assert name in shipped
    assert (
        any("chat_template" in name for name in shipped)
        or b"chat_template" in shipped["tokenizer/tokenizer_config.json"]
    )

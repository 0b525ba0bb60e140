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
        [sys.executable, "-m", "scripts.make_assets", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rebuilt = {str(p.relative_to(tmp_path)): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    shipped = shipped_files()
    if _transformers_major() >= 5:  # the assets are written by transformers 5: byte for byte
        assert sorted(rebuilt) == sorted(shipped)
        for name, data in shipped.items():
            assert rebuilt[name] == data, f"{name} differs from a fresh run of scripts/make_assets.py"
        return
    # transformers 4.x saves its own tokenizer_config.json format (and a special_tokens_map.json): what it
    # guarantees is the same tokenizer. Every other file is byte-equal; the tokenizers give the same ids and
    # render the chat template the same.
    tokenizer_config = "tokenizer/tokenizer_config.json"
    assert set(shipped) <= set(rebuilt) and set(rebuilt) - set(shipped) <= {"tokenizer/special_tokens_map.json"}
    for name, data in shipped.items():
        assert name == tokenizer_config or rebuilt[name] == data, f"{name} differs from scripts/make_assets.py"
    _assert_same_tokenizer(tmp_path / "tokenizer")


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def _assert_same_tokenizer(rebuilt_dir: Path) -> None:
    import json

    from transformers import AutoTokenizer

    from zero_kit.model import load_tokenizer

    shipped, rebuilt = load_tokenizer(None), AutoTokenizer.from_pretrained(str(rebuilt_dir))
    rows = [json.loads(line) for line in (ASSETS / "data" / "alpaca.jsonl").read_text().splitlines()[:50]]
    texts = [" ".join(str(v) for v in row.values()) for row in rows] + ["ZeRO stage 3 shards parameters."]
    assert [shipped(t)["input_ids"] for t in texts] == [rebuilt(t)["input_ids"] for t in texts]
    assert shipped.all_special_tokens == rebuilt.all_special_tokens
    chat = [{"role": "user", "content": "What does ZeRO-3 shard?"}, {"role": "assistant", "content": "Everything."}]
    assert shipped.apply_chat_template(chat, tokenize=False) == rebuilt.apply_chat_template(chat, tokenize=False)


def test_assets_are_small_and_complete():
    shipped = shipped_files()
    assert sum(len(data) for data in shipped.values()) < 2_000_000
    for name in ["tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json", "data/alpaca.jsonl", "data/chat.jsonl"]:
        assert name in shipped
    assert (
        any("chat_template" in name for name in shipped)
        or b"chat_template" in shipped["tokenizer/tokenizer_config.json"]
    )

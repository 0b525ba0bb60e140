"""The real-world corpus (tests/fixtures/realworld/): complete, verdicts from the consumers' own parse, and
`zero-kit validate` agreeing with those verdicts (no error on a working config, the right error on a broken one)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from zero_kit.cli import main

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "realworld"
ENTRIES = json.loads((CORPUS / "MANIFEST.json").read_text())["configs"]
CONSUMERS = {"deepspeed", "hf-trainer", "accelerate"}


def _verdicts_module():
    spec = importlib.util.spec_from_file_location("realworld_verdicts", ROOT / "scripts" / "realworld_verdicts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_manifest_lists_every_file_and_nothing_else():
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.json") if p.name != "MANIFEST.json"}
    listed = [e["path"] for e in ENTRIES]
    assert len(listed) == len(set(listed))
    assert set(listed) == on_disk


def test_manifest_size_and_sources():
    assert len(ENTRIES) >= 60
    assert len({e["source_repo"] for e in ENTRIES if e["commit"]}) >= 10
    for entry in ENTRIES:
        assert entry["consumer"] in CONSUMERS, entry
        assert isinstance(entry["world_size"], int) and entry["world_size"] >= 1, entry
        assert entry["verdict"] in ("works", "broken"), entry
        if entry["commit"] is None:  # posted in an issue thread: no commit, the thread instead
            assert entry["thread"].startswith("https://github.com/"), entry
        else:
            assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]), entry
            assert entry["source_path"], entry
        if entry["verdict"] == "broken":
            assert entry["error"] and entry["key_path"], entry


def test_corpus_has_both_verdicts_and_issue_threads():
    assert {e["verdict"] for e in ENTRIES} == {"works", "broken"}
    assert any(e.get("thread") for e in ENTRIES)


def test_verdicts_agree_with_the_consumers_parse():
    rows = _verdicts_module().check_all()
    wrong = [(r["path"], r["expected"], r["verdict"], r["error"]) for r in rows if r["verdict"] != r["expected"]]
    assert not wrong


def _validate(entry: dict, capsys) -> tuple[int, list[dict]]:
    args = ["validate", str(CORPUS / entry["path"]), "--for", entry["consumer"]]
    code = main([*args, "--world-size", str(entry["world_size"]), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else []


def _errors(problems: list[dict]) -> list[str]:
    return [f"{p.get('path')}: {p.get('message')}" for p in problems if p.get("severity") == "error"]


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["verdict"] == "works"], ids=lambda e: e["path"])
def test_validate_passes_working_config(entry, capsys):
    code, problems = _validate(entry, capsys)
    assert code == 0, _errors(problems)


def _at_or_under(path: str | None, key_path: str) -> bool:
    return path is not None and (path == key_path or path.startswith(key_path + "."))


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["verdict"] == "broken"], ids=lambda e: e["path"])
def test_validate_fails_broken_config_at_the_key(entry, capsys):
    code, problems = _validate(entry, capsys)
    assert code == 1, f"validate exit {code}; consumer says: {entry['error']}"
    paths = [p.get("path") for p in problems if p.get("severity") == "error"]
    assert any(_at_or_under(path, entry["key_path"]) for path in paths), (entry["key_path"], _errors(problems))

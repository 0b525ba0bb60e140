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


def _still_supported(entry: dict) -> bool:
    """MANIFEST.json's verdicts are DeepSpeed 0.19's, which removed whole features (deepspeedai/DeepSpeed#8489):
    their blocks and the 1-bit optimizers. True when the entry is broken only by such a removal and the installed
    DeepSpeed (the oldest supported, in CI's compatibility job) still has the feature, asked of DeepSpeed itself."""
    import deepspeed.runtime.config as ds_config

    if entry["verdict"] != "broken" or entry["consumer"] != "deepspeed":
        return False
    error = entry["error"] or ""
    if "has been removed" in error:
        return entry["key_path"] not in getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    optimizer = re.search(r"module 'torch.optim' has no attribute '(\w+)'", error)
    return bool(optimizer) and optimizer.group(1).lower() in ds_config.DEEPSPEED_OPTIMIZERS


def _verdict_here(entry: dict) -> str:
    return "works" if _still_supported(entry) else entry["verdict"]


def test_verdicts_agree_with_the_consumers_parse():
    entries = {e["path"]: e for e in ENTRIES}
    rows = _verdicts_module().check_all()
    wrong = [
        (r["path"], _verdict_here(entries[r["path"]]), r["verdict"], r["error"])
        for r in rows
        if r["verdict"] != _verdict_here(entries[r["path"]])
    ]
    assert not wrong


def _validate(entry: dict, capsys) -> tuple[int, list[dict]]:
    # Only validate's own output: a first `import deepspeed` earlier in this test (_still_supported, before main
    # installs its filter) logs DeepSpeed's CPU accelerator notice to stdout, which must not reach json.loads.
    capsys.readouterr()
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


REMOVED_IN_0_19 = [
    e for e in ENTRIES if e["verdict"] == "broken" and re.search(r"has been removed|torch.optim", e["error"])
]


@pytest.mark.parametrize("entry", REMOVED_IN_0_19, ids=lambda e: e["path"])
def test_configs_broken_by_a_later_removal_pass_where_the_feature_exists(entry, capsys):
    """On DeepSpeed 0.19 these are broken (the test below); on an older supported release that still has the
    feature they work, and validate must pass them."""
    if not _still_supported(entry):
        return  # the installed release removed it: test_validate_fails_broken_config_at_the_key checks the error
    code, problems = _validate(entry, capsys)
    assert code == 0, (entry["path"], _errors(problems))


def _at_or_under(path: str | None, key_path: str) -> bool:
    return path is not None and (path == key_path or path.startswith(key_path + "."))


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["verdict"] == "broken"], ids=lambda e: e["path"])
def test_validate_fails_broken_config_at_the_key(entry, capsys):
    if _still_supported(entry):  # works on this older release: test_configs_broken_by_a_later_removal_... checks it
        return
    code, problems = _validate(entry, capsys)
    assert code == 1, f"validate exit {code}; consumer says: {entry['error']}"
    paths = [p.get("path") for p in problems if p.get("severity") == "error"]
    assert any(_at_or_under(path, entry["key_path"]) for path in paths), (entry["key_path"], _errors(problems))

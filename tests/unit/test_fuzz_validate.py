"""Property-based fuzzing of `zero-kit validate` (issue 6, item 5).

Thousands of malformed and mutated DeepSpeed configs (wrong types, unknown and misspelt keys, nested
garbage, huge numbers, NaN, non-JSON text) must never raise, every problem must name a key path
(or, for unreadable files, a line), and whatever the linter accepts DeepSpeed's own parser accepts.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zero_kit.cli import main
from zero_kit.lint import LintContext, lint
from zero_kit.lint.discover import deepspeed_parse, discover

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
SEEDS = [json.loads(p.read_text()) for p in sorted((FIXTURES / "deepspeed").glob("*.json"))]
SEEDS.append({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 1}})
HF_SEEDS = [json.loads(p.read_text()) for p in sorted((FIXTURES / "hf-trainer").glob("*.json"))]


def fuzz_settings(max_examples: int) -> settings:
    return settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)


STATS = {"cases": 0, "accepted": 0}


@functools.cache
def _vocabulary() -> list[str]:
    """Real key names (so mutations hit the sections that matter), from the discovered schema."""
    schema = discover()
    names = {k for keys in schema.keys.values() for k in keys}
    for model in schema.models.values():
        names |= set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    return sorted(n for n in names if isinstance(n, str))


# Values a mutation writes: every JSON kind, numbers as strings, "auto", huge and non-finite numbers.
PLAIN_VALUES = [None, True, False, 0, 1, 2, 3, 4, 8, -1, 0.5, 1e-4, 5e8, 10**30, -(2**70), float("nan"), float("inf")]
PLAIN_VALUES += [
    "auto",
    "8",
    "1e-4",
    "true",
    "cpu",
    "nvme",
    "none",
    "fp16",
    "bf16",
    "",
    "AdamW",
    "WarmupLR",
    "x y",
    [],
    {},
]


def _random_value(rnd: random.Random, vocabulary: list[str], depth: int = 0):
    roll = rnd.random()
    if roll < 0.75 or depth > 2:
        return copy.deepcopy(rnd.choice(PLAIN_VALUES))
    if roll < 0.85:
        return [_random_value(rnd, vocabulary, depth + 1) for _ in range(rnd.randint(0, 3))]
    keys = [rnd.choice(vocabulary) for _ in range(rnd.randint(0, 3))]
    return {k: _random_value(rnd, vocabulary, depth + 1) for k in keys}


def _typo(word: str, rnd: random.Random) -> str:
    i = rnd.randrange(len(word) + 1)
    return rnd.choice([word[:i] + word[i + 1 :], word[:i] + "_" + word[i:], word.upper(), word + "s", " " + word])


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, 2, 3, 4, 8, -1, 10**12])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["auto", "8", "1e-4", "true", "cpu", "nvme", "none", "fp16", "bf16", "", "AdamW", "WarmupLR"])
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _dict_paths(node: dict, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix]
    for key, value in node.items():
        if isinstance(value, dict):
            paths += _dict_paths(value, (*prefix, key))
    return paths


def _mutate(config: dict, rnd: random.Random, vocabulary: list[str]) -> dict:
    """One mutation at a random depth: set a (real, misspelt or random) key to a random value, or delete one."""
    node = config
    for key in rnd.choice(_dict_paths(config)):
        node = node[key]
    action = rnd.choice(["perturb", "perturb", "set-existing", "set-known", "set-typo", "set-random", "delete"])
    if action == "delete" and node:
        node.pop(rnd.choice(sorted(node)))
        return config
    if action == "perturb" and node:
        # Same JSON kind, new value: mostly still well-typed, so DeepSpeed's own checks get exercised.
        key = rnd.choice(sorted(node))
        kind = type(node[key])
        same = [v for v in PLAIN_VALUES if type(v) is kind or (kind in (int, float) and type(v) in (int, float))]
        if same:
            node[key] = copy.deepcopy(rnd.choice(same))
            return config
    key = rnd.choice(sorted(node)) if action == "set-existing" and node else rnd.choice(vocabulary)
    if action == "set-typo":
        key = _typo(key, rnd)
    elif action == "set-random":
        key = "".join(rnd.choice("ab_. \u00e9") for _ in range(rnd.randint(0, 6)))
    node[key] = _random_value(rnd, vocabulary)
    return config


def _check(config, world_size: int | None, target: str) -> None:
    problems = lint(config, LintContext(world_size=world_size, target=target))
    STATS["cases"] += 1
    for problem in problems:
        assert problem.severity in ("error", "warning")
        assert isinstance(problem.path, str) and problem.path, problem
        assert problem.message and problem.fix, problem
        json.dumps(problem.to_dict(), default=str)  # --json can always print it
    if target == "deepspeed" and world_size and not any(p.severity == "error" for p in problems):
        STATS["accepted"] += 1
        assert deepspeed_parse(copy.deepcopy(config), world_size) is None, (config, world_size)


@fuzz_settings(1800)
@given(
    rnd=st.randoms(use_true_random=False), seed=st.sampled_from(range(len(SEEDS))), world=st.sampled_from([1, 2, 4, 8])
)
def test_mutated_configs(rnd, seed, world):
    # Mutations are drawn from one seeded Random (cheap, and hypothesis still replays failures).
    config = copy.deepcopy(SEEDS[seed])
    if "train_batch_size" in config:  # make the seed right for this world size, so mutations start from valid
        config["train_batch_size"] = (
            config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * world
        )
    vocabulary = _vocabulary()
    for _ in range(rnd.randint(1, 3)):
        config = _mutate(config, rnd, vocabulary)
    _check(config, world, "deepspeed")


@fuzz_settings(500)
@given(
    rnd=st.randoms(use_true_random=False), seed=st.sampled_from(range(len(HF_SEEDS))), world=st.sampled_from([None, 2])
)
def test_mutated_hf_configs(rnd, seed, world):
    """Real-world style HF configs (full of "auto"), mutated, judged for the HF Trainer: never a crash."""
    config = copy.deepcopy(HF_SEEDS[seed])
    for _ in range(rnd.randint(1, 3)):
        config = _mutate(config, rnd, _vocabulary())
    _check(config, world, rnd.choice(["hf-trainer", "accelerate"]))


@fuzz_settings(600)
@given(
    config=JSON_VALUES,
    world=st.sampled_from([None, 1, 3]),
    target=st.sampled_from(["deepspeed", "hf-trainer", "accelerate"]),
)
def test_arbitrary_json(config, world, target):
    _check(config, world, target)


@fuzz_settings(600)
@given(
    data=st.data(),
    overrides=st.dictionaries(
        st.sampled_from(["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"]), SCALARS
    ),
    world=st.sampled_from([1, 2, 3, 4, 8, 64]),
)
def test_batch_arithmetic(data, overrides, world):
    config = {"zero_optimization": {"stage": data.draw(st.sampled_from([0, 1, 2, 3]))}, **overrides}
    _check(config, world, "deepspeed")


TEXTS = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    JSON_VALUES.map(lambda v: json.dumps(v)[: len(json.dumps(v)) // 2]),  # truncated JSON
    st.just('{"train_batch_size": 8,, }'),
)


@fuzz_settings(150)
@given(text=TEXTS)
def test_cli_never_tracebacks_on_text(text, tmp_path_factory):
    """In-process CLI on arbitrary file contents: exit 0/1/2, and an unreadable file names its line."""
    path = tmp_path_factory.mktemp("fuzz") / "config.json"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    code = main(["validate", str(path), "--json", "--world-size", "2"])
    assert code in (0, 1, 2)


def test_cli_json_reports_line_for_garbage(tmp_path, capsys):
    # A trailing comma: strict json.load (the HF Trainer, accelerate) refuses it; DeepSpeed's hjson read does not.
    path = tmp_path / "c.json"
    path.write_text('{"zero_optimization": {"stage": 3,}}')
    assert main(["validate", str(path), "--json", "--for", "hf-trainer"]) == 2
    (problem,) = json.loads(capsys.readouterr().out)
    assert problem["line"] == 1 and problem["column"] > 1
    assert main(["validate", str(path), "--json"]) == 1  # read as hjson, then: no batch size
    assert any("not strict JSON" in p["message"] for p in json.loads(capsys.readouterr().out))


def test_cli_subprocesses_never_traceback(tmp_path):
    """A couple dozen real processes (the way users run it): only exit codes 0/1/2, never a traceback."""
    samples = [
        "",
        "{",
        "[]",
        "null",
        '"auto"',
        "NaN",
        '{"train_batch_size": 1e400}',
        '{"train_batch_size": 99999999999999999999999999999999}',
        '{"train_batch_size": 4, "zero_optimization": {"stage": "3"}}',
        '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"offload_param": {"device": ["cpu"]}}}',
        '{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": null, "params": []}}',
        '{"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": 3, "params": {"a": {}}}}',
        '{"train_micro_batch_size_per_gpu": 1, "fp16": true, "bf16": "yes"}',
        '{"train_micro_batch_size_per_gpu": 1, "checkpoint": {"tag_validation": 7}}',
        '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": null}}',
        '{"' + "a" * 10000 + '": 1}',
        "[" * 100000,
    ]
    paths = []
    for i, text in enumerate(samples):
        path = tmp_path / f"s{i}.json"
        path.write_text(text)
        paths.append(str(path))
    env = {**os.environ, "WORLD_SIZE": "2"}
    # One process per sample would cost ~5 s of imports each; batches of files keep it to a few processes.
    for start in range(0, len(paths), 6):
        run = subprocess.run(
            [sys.executable, "-m", "zero_kit.cli", "validate", *paths[start : start + 6], "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
        )
        assert run.returncode in (0, 1, 2), run.stderr
        assert "Traceback" not in run.stdout + run.stderr
        for problem in json.loads(run.stdout):
            assert problem.get("path") or problem.get("line") or problem["message"] == "no such file", problem


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    """Prints the fuzz case count and time (pytest -s shows it)."""
    start = time.perf_counter()
    yield
    elapsed = time.perf_counter() - start
    print(
        f"\nfuzz: {STATS['cases']} lint cases, {STATS['accepted']} accepted and re-checked by DeepSpeed, {elapsed:.1f} s"
    )
    assert not math.isnan(elapsed)

"""Property-based fuzzing of the generator's inputs: random `zero-kit config` flag combinations (valid and
invalid choices, negative / zero / huge / non-numeric numbers, NaN, missing and unreadable --model dirs,
unwritable -o) never let a traceback escape. `zero_kit.cli.main` returns 0 or 2; a 2 names a flag (or the file
it could not read) on stderr; a 0 writes a JSON object that DeepSpeed's own parser accepts, or else that
`zero-kit validate` flags with an error (checked for configs without "auto" values). The second case is a gap
of the generator (it should have refused the flag): counted in STATS["generator_gaps"] and printed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zero_kit.cli import main
from zero_kit.lint import LintContext, lint
from zero_kit.lint.discover import deepspeed_parse

STATS = {"cases": 0, "accepted": 0, "parsed_by_deepspeed": 0, "generator_gaps": 0}
GAPS: dict[str, list[str]] = {}

INTS = st.one_of(
    st.integers(-3, 16).map(str),
    st.integers(-(10**15), 10**15).map(str),
    st.sampled_from(["", "1.5", "nan", "1e3", "0x10", " 4", "٣", "inf"]),
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "1e-4", "-0.0", "nan", "inf", "abc", "1e309"]),
)


def _choice(*options: str):
    return st.sampled_from(options)


def _value_strategies(tmp: Path) -> dict:
    bad_model = tmp / "bad_model"
    return {
        "--stage": _choice("0", "1", "2", "3", "4", "-1", "two", ""),
        "--offload-optimizer": _choice("none", "cpu", "nvme", "gpu", ""),
        "--offload-param": _choice("none", "cpu", "nvme", "disk"),
        "--nvme-path": _choice(str(tmp / "nvme"), "", str(tmp / "missing" / "nvme"), "auto"),
        "--precision": _choice("bf16", "fp16", "fp32", "fp8", "BF16"),
        "--micro-batch": INTS,
        "--grad-accum": INTS,
        "--global-batch": INTS,
        "--world-size": INTS,
        "--nodes": INTS,
        "--gpus-per-node": INTS,
        "--hidden-size": INTS,
        "--lr": FLOATS,
        "--weight-decay": FLOATS,
        "--gradient-clipping": FLOATS,
        "--hpz-partition-size": INTS,
        "--device": _choice("cuda", "cpu", "gpu"),
        "--model": _choice(str(tmp / "no_such_model"), str(bad_model), str(tmp / "good_model"), str(tmp / "file")),
        "--accelerate-yaml": _choice(str(tmp / "acc.yaml"), str(tmp / "file" / "acc.yaml")),
        "-o": _choice(str(tmp / "out" / "ds.json"), str(tmp / "file" / "ds.json"), str(tmp)),
    }


SWITCHES = ["--pin-memory", "--no-pin-memory", "--hf-auto", "--no-hf-auto", "--hpz", "--quantized-weights",
            "--quantized-gradients", "--bf16-master-weights", "--bf16-optimizer-states", "--torch-autocast"]  # fmt: skip


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz_config")
    (root / "nvme").mkdir()
    (root / "file").write_text("a file where a directory is expected")
    (root / "bad_model").mkdir()
    (root / "bad_model" / "config.json").write_bytes(b'{"hidden_size": "wide", \xff')
    (root / "good_model").mkdir()
    (root / "good_model" / "config.json").write_text(json.dumps({"hidden_size": 256, "model_type": "llama"}))
    return root


def _argv_strategy(tmp: Path):
    values = _value_strategies(tmp)
    pair = st.sampled_from(sorted(values)).flatmap(lambda flag: st.tuples(st.just(flag), values[flag]))
    item = st.one_of(pair.map(list), st.sampled_from(SWITCHES).map(lambda s: [s]))
    return st.lists(item, max_size=8).map(lambda items: [token for part in items for token in part])


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(["config", *argv])
    except SystemExit as exc:  # argparse rejects a value: it exits 2 after printing usage and the flag
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _emitted(argv: list[str], out: str) -> dict:
    if "-o" in argv:
        return json.loads(Path(argv[len(argv) - 1 - argv[::-1].index("-o") + 1]).read_text())
    return json.loads(out)


def _world_size(config: dict) -> int:
    tbs, micro, accum = (
        config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    )
    if all(isinstance(v, int) for v in (tbs, micro, accum)):
        return tbs // (micro * accum)
    return 1


def _deepspeed_accepts_or_validate_refuses(argv: list[str], config: dict) -> None:
    world = _world_size(config)
    rejected = deepspeed_parse(copy.deepcopy(config), world)
    if rejected is None:
        STATS["parsed_by_deepspeed"] += 1
        return
    errors = [p for p in lint(config, LintContext(world_size=world)) if p.severity == "error"]
    assert errors, f"the generator wrote a config DeepSpeed rejects and validate passes: {argv} -> {rejected}"
    STATS["generator_gaps"] += 1
    GAPS.setdefault(errors[0].path, argv)
    raise AssertionError(f"the generator should have refused {argv}: DeepSpeed rejects its config ({rejected})")


def test_random_config_flags_never_raise(tmp, capsys):
    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(argv=_argv_strategy(tmp))
    def check(argv):
        STATS["cases"] += 1
        code, out, err = _run(argv, capsys)
        assert "Traceback" not in out + err, (argv, err)
        assert code in (0, 2), (argv, code, err)
        if code == 2:
            named = [token for token in argv if token.startswith("-") or "/" in token]
            assert any(token in err for token in named) or not argv, f"error names no flag or file: {argv} -> {err!r}"
            return
        STATS["accepted"] += 1
        config = _emitted(argv, out)
        assert isinstance(config, dict) and config["zero_optimization"]["stage"] in (0, 1, 2, 3)
        if "auto" not in json.dumps(config):
            _deepspeed_accepts_or_validate_refuses(argv, config)

    check()
    print(f"\nzero-kit config fuzz: {STATS}; accepted by the generator, refused by validate: {GAPS}")
    assert STATS["accepted"] > 20 and STATS["cases"] - STATS["accepted"] > 20, STATS

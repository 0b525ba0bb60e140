"""`zero-kit train --config run.yaml`: keys are the flags, the command line wins, every problem of the file is
named with FILE:LINE at once, and the effective options a run writes read back to the same options."""

from __future__ import annotations

import argparse

import pytest

from tests.support.mistakes import answer, assert_refused
from zero_kit.cli import _with_run_file, build_parser
from zero_kit.errors import UserError
from zero_kit.options import dataclass_from_args
from zero_kit.train.options import TrainOptions, read_run_file, run_file_text


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = build_parser("train")
    return _with_run_file(parser, argv, parser.parse_args(argv))


def _file(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_file_sets_options_and_the_command_line_wins(tmp_path):
    run = _file(tmp_path, "max_steps: 3\nstage: 3\nlr: 1e-3\npack: true\nlora-r: 8\nformat: chat\n")
    args = _parse(["train", "--config", run, "--max-steps", "7", "--no-pack"])
    assert (args.max_steps, args.stage, args.lr, args.pack, args.lora_r, args.format) == (7, 3, 1e-3, False, 8, "chat")
    plain = _parse(["train", "--config", run])
    assert (plain.max_steps, plain.pack) == (3, True)


def test_every_problem_is_named_with_its_line_at_once(tmp_path):
    run = _file(tmp_path, "stage: 3\nmax_step: 3\nstage_x: 1\nlr: fast\npack: maybe\nformat: sharegpt\n")
    with pytest.raises(UserError) as caught:
        _parse(["train", "--config", run])
    text = str(caught.value)
    assert text.startswith(f"5 problems in the run file {run}"), text
    assert f"{run}:2: unknown key 'max_step'" in text and "did you mean 'max_steps'?" in text
    assert f"{run}:3: unknown key 'stage_x'" in text
    assert f"{run}:4: lr: 'fast' is not a valid value for --lr" in text
    assert f"{run}:5: pack: 'maybe' is not a valid value for --pack (expected true or false)" in text
    assert f"{run}:6: format: 'sharegpt' is not a valid value for --format (expected one of alpaca, chat, text)" in text


def test_a_key_given_twice_is_refused_not_silently_overwritten(tmp_path):
    run = _file(tmp_path, "stage: 2\nmax_steps: 3\nstage: 3\n")
    with pytest.raises(UserError, match=r"line 3: key 'stage' given twice \(first on line 1\)"):
        _parse(["train", "--config", run])


@pytest.mark.parametrize(
    ("text", "needle"),
    [("stage: [3\n", ":2: not valid YAML"), ("- stage\n- 3\n", "holds a list, not a mapping"),
     ("config: other.yaml\n", "unknown key 'config'"), ("stage:\n  value: 3\n", "expected one int, got a mapping")],
)  # fmt: skip
def test_files_that_are_not_run_files(tmp_path, text, needle):
    with pytest.raises(UserError, match=needle.replace("[", r"\[")):
        _parse(["train", "--config", _file(tmp_path, text)])


def test_an_empty_file_changes_nothing(tmp_path):
    assert vars(_parse(["train", "--config", _file(tmp_path, "# nothing yet\n")])) == {
        **vars(_parse(["train"])), "config": str(tmp_path / "run.yaml")}  # fmt: skip


def test_the_effective_options_read_back_to_the_same_options(tmp_path):
    opts = TrainOptions(stage=3, max_steps=5, lr=3e-4, lora_r=4, lora_alpha=8.0, pack=True, format="chat",
                        output=str(tmp_path / "out"), data="train.jsonl")  # fmt: skip
    run = _file(tmp_path, run_file_text(opts, "train"))
    assert dataclass_from_args(TrainOptions, _parse(["train", "--config", run])) == opts
    parser = build_parser("train")
    sub = next(a for a in parser._actions if a.dest == "command").choices["train"]
    assert set(read_run_file(run, sub, "train")) == {f for f in vars(opts)}


def test_the_command_refuses_a_bad_run_file_before_any_work(tmp_path):
    run = _file(tmp_path, "max_step: 3\n")
    found = answer("train", "--config", run, "--output", str(tmp_path / "out"))
    assert_refused(found, f"{run}:1: unknown key 'max_step'", "did you mean 'max_steps'?", code=2)
    assert not (tmp_path / "out").exists()
    missing = answer("train", "--config", str(tmp_path / "nope.yaml"))
    assert_refused(missing, "--config", "nope.yaml: no such file", code=2)

"""A rank of a multi-rank job leaves with its exit code and flushed output, skipping interpreter teardown
(where gloo/DeepSpeed C++ destructors could abort with SIGABRT and hide the real code from the launcher)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys
import torch  # a rank has torch loaded
atexit.register(lambda: print("TEARDOWN RAN", flush=True))
sys.argv = ["zero-kit", "config", "--stage", "4"]
from zero_kit.cli import console
print("before", end="")  # unflushed on purpose: must still come out
console()
"""


def _run(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env={**env, **env_extra})


def test_rank_of_multi_rank_job_exits_with_code_and_output_but_no_teardown():
    proc = _run({"WORLD_SIZE": "2", "RANK": "1"})
    assert proc.returncode == 2, proc.stderr  # --stage 4 is a user error
    assert "--stage" in proc.stderr
    assert proc.stdout.startswith("before")
    assert "TEARDOWN RAN" not in proc.stdout


def test_single_process_keeps_normal_teardown():
    proc = _run({})
    assert proc.returncode == 2
    assert "TEARDOWN RAN" in proc.stdout


# Issue 30: the command line's own answers (in-process: quick), beside the tier of mistakes (tests/mistakes).


def test_top_level_help_is_for_users(capsys):
    from zero_kit.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert "DeepSpeed ZeRO for LLaMA-style models" in shown and "zero-kit COMMAND --help" in shown
    assert "add_arguments" not in shown  # not cli.py's developer docstring


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["train", "--max-step", "3"], "did you mean --max-steps (not --max-step)?"),
        (["plna"], "did you mean 'plan'?"),
        (["plan", "--rank-by", "tim"], "did you mean 'time'?"),
    ],
)
def test_no_prefixes_and_a_did_you_mean(argv, fix, capsys):
    from zero_kit.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert f"  fix: {fix}" in capsys.readouterr().err


def test_launch_slurm_says_the_size_it_filled_in(tmp_path, capsys):
    from zero_kit.cli import main

    assert main(["launch", "--slurm", "-o", str(tmp_path / "job.sbatch")]) == 0
    assert "2 nodes x 8 GPUs (--nodes and --gpus-per-node not given: defaults)" in capsys.readouterr().err
    assert main(["launch", "--slurm", "--nodes", "1", "--gpus-per-node", "2", "-o", str(tmp_path / "job.sbatch")]) == 0
    assert "not given" not in capsys.readouterr().err  # rewrites its own script, quietly about sizes given


def test_plan_and_config_keep_a_config_they_would_not_write_unless_forced(tmp_path, capsys):
    """Issue 53: `config -o` over a generated file whose value was edited by hand (formatting kept) replaced the edit
    with exit 0. A file holding exactly what the command writes is left as it is; any other is kept without --force."""
    from zero_kit.cli import main
    from zero_kit.errors import UserError

    out = tmp_path / "ds.json"
    assert main(["config", "--stage", "2", "-o", str(out)]) == 0
    written = out.stat().st_mtime_ns
    assert main(["config", "--stage", "2", "-o", str(out)]) == 0 and out.stat().st_mtime_ns == written
    out.write_text(out.read_text().replace('"stage": 2', '"stage": 3'))  # a hand edit of a value, formatting kept
    edited = out.read_text()
    for argv in (["config", "--stage", "2", "-o", str(out)], ["plan", "--model", "llama-3-8b", "--gpu-mem", "80GB",
                                                             "-o", str(out)]):  # fmt: skip
        capsys.readouterr()
        assert main(argv) == 2
        said = capsys.readouterr().err
        assert "edited by hand" in said and "--force" in said
        assert out.read_text() == edited
    out.write_text(out.read_text().replace('"stage"', '"stage" ', 1))  # not even zero-kit's formatting: refused early
    with pytest.raises(UserError, match="--force"):
        from zero_kit.commands.config import check_output

        check_output(str(out), "-o", force=False)
    assert main(["config", "--stage", "3", "-o", str(out), "--force"]) == 0


def test_peek_reads_first_rows_only_and_fails_like_the_reader(tmp_path):
    from zero_kit.data.files import PEEK_BYTES, peek_source
    from zero_kit.data.formats import BadRow, check_row
    from zero_kit.errors import UserError

    big = tmp_path / "big.jsonl"
    row = '{"text": "' + "x" * 1000 + '"}\n'
    big.write_text(row * (2 * PEEK_BYTES // len(row)) + "not json\n")  # the bad line is past the peek
    source, columns_known = peek_source(str(big), limit=4)
    assert len(source.rows) == 4 and not columns_known
    check_row(source.rows[0], "text")
    with pytest.raises(BadRow):
        check_row(source.rows[0], "alpaca")
    torn = tmp_path / "torn.jsonl"
    torn.write_text(row + "{cut\n")
    with pytest.raises(UserError, match="line 2"):
        peek_source(str(torn))
    (tmp_path / "dir").mkdir()
    with pytest.raises(UserError, match="save_to_disk"):
        peek_source(str(tmp_path / "dir"))


def test_train_input_checks_pass_every_readable_kind_of_data(tmp_path):
    """check_inputs refuses only what the ranks would refuse: each file kind the reader takes passes it."""
    import json

    import pandas

    from zero_kit.train.guards.inputs import check_inputs
    from zero_kit.train.options import TrainOptions

    rows = [{"instruction": f"q{i}", "input": "", "output": f"a{i}"} for i in range(3)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.json").write_text(json.dumps(rows))
    pandas.DataFrame(rows).to_csv(tmp_path / "a.csv", index=False)
    pandas.DataFrame(rows).to_parquet(tmp_path / "a.parquet")
    from datasets import Dataset

    Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    for name in ("a.jsonl", "a.json", "a.csv", "a.parquet", "saved"):
        check_inputs(TrainOptions(data=str(tmp_path / name), output=str(tmp_path / "out" / "run")))
    assert not (tmp_path / "out").exists()  # checked, not created
    from zero_kit.errors import UserError

    with pytest.raises(UserError, match=r"missing column\(s\) \['text'\]"):  # what load_dataset_rows says, at once
        check_inputs(TrainOptions(data=str(tmp_path / "a.csv"), format="text", output=str(tmp_path)))

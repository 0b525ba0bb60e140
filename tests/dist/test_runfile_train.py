"""A real run from a run file: `zero-kit train --config run.yaml` (a flag on the command line beside it) trains,
writes its effective options as OUTPUT/zero_kit_run.yaml, which reads back to the same options, and draws
OUTPUT/loss.png. One process, the embedded model: ~15 s."""

from __future__ import annotations

import pytest

from tests.support.jobs import env, zero_kit
from zero_kit.cli import _with_run_file, build_parser
from zero_kit.options import dataclass_from_args
from zero_kit.train.options import TrainOptions
from zero_kit.train.callbacks import LOSS_PNG
from zero_kit.train.options import EFFECTIVE

pytestmark = pytest.mark.dist


def _options(argv: list[str]) -> TrainOptions:
    parser = build_parser("train")
    return dataclass_from_args(TrainOptions, _with_run_file(parser, argv, parser.parse_args(argv)))


def test_a_run_file_trains_and_the_run_writes_one_that_repeats_it(tmp_path):
    import subprocess

    out = tmp_path / "out"
    run = tmp_path / "run.yaml"
    run.write_text(f"output: {out}\nmax_steps: 50\nmax-length: 64\nmicro_batch: 2\nlog_steps: 1\nstage: 2\n"
                   "export: false\n", encoding="utf-8")  # fmt: skip
    done = subprocess.run(zero_kit("train", "--config", str(run), "--max-steps", "3"), env=env(), capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "step 3/3" in done.stdout, done.stdout[-2000:]
    effective = out / EFFECTIVE
    assert effective.read_text().startswith("# The effective options of this run")
    repeated = _options(["train", "--config", str(effective)])
    assert repeated == _options(["train", "--config", str(run), "--max-steps", "3"])
    assert (repeated.max_steps, repeated.max_length, repeated.stage, repeated.export) == (3, 64, 2, False)
    assert (out / LOSS_PNG).read_bytes().startswith(b"\x89PNG") and f"loss plot in {out / LOSS_PNG}" in done.stdout

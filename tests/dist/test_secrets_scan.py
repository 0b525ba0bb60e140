"""Issue 25 part 1, end to end: secrets planted in the environment (HF_TOKEN, WANDB_API_KEY, a *_PASSWORD) reach no
file that `zero-kit train --nproc 2` (with its export to final/), `zero-kit export` and `zero-kit bench` leave, nor
their output, under umask 0 (so a file zero_kit forgot to make private would show up as world-readable too). The
train run is no launch of this test's own: it is the shared two-rank ZeRO-3 reference (reliability_helpers.py's
zero3_reference: 8 steps, a checkpoint every 2, trained once per test run with PLANTED in its environment and under
umask 0); export runs on a copy of its last checkpoint. The one file that must carry a secret,
OUTPUT/.deepspeed_secrets/HF_TOKEN of a --hostfile run (remote ranks need it; the .deepspeed_env line reads it
there), is built by the same relaunch plan `zero-kit train --hostfile` uses and written by the same `write_files`: it
is 0600, and so is the env file. A real pdsh run needs ssh between hosts, which the multinode tier has; its pdsh
command line is DeepSpeed's (see docs/clusters.md, "Secrets and untrusted models")."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from reliability_helpers import PLANTED, STEPS, zero3_reference

from tests.support.jobs import run, zero_kit
from zero_kit.dist import free_port

pytestmark = pytest.mark.dist


def _leaks(root: Path, allowed: set[Path]) -> list[str]:
    """`path: NAME` for every planted value found in a file under `root` (bytes: pickles and safetensors too)."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p not in allowed):
        data = path.read_bytes()
        found += [f"{path}: {name}" for name, value in PLANTED.items() if value.encode() in data]
    return found


def _output_leaks(what: str, proc) -> list[str]:
    return [f"{what} output: {name}" for name, value in PLANTED.items() if value in proc.stdout + proc.stderr]


def test_no_secret_in_what_train_export_and_bench_leave(tmp_path_factory, tmp_path, umask_zero):
    reference = zero3_reference(tmp_path_factory)  # the train run, with PLANTED in its environment
    out, copied, exported, bench = reference / "run", tmp_path / "run", tmp_path / "exported", tmp_path / "bench"
    train_output = (reference / "output.txt").read_text()
    assert (out / "final" / "model.safetensors").is_file() and "zero-kit train: launching" in train_output
    shutil.copytree(out / f"checkpoint-{STEPS}", copied / f"checkpoint-{STEPS}")  # a reader never writes into it
    export = run(zero_kit("export", str(copied / f"checkpoint-{STEPS}"), "--out", str(exported)), extra_env=PLANTED)
    bench_run = run(zero_kit("bench", "--strategies", "zero2", "--nproc", "2", "--steps", "3", "--warmup", "1",
                             "--seq-len", "32", "--layers", "2", "--out", str(bench), "--master-port", str(free_port())),
                    extra_env=PLANTED, timeout=400)  # fmt: skip
    assert any(bench.rglob("*.json*")), "the bench run left no record to scan"
    env_file = _hostfile_env_file(tmp_path)
    secret_file = env_file.parent / ".deepspeed_secrets" / "HF_TOKEN"
    leaks = _leaks(tmp_path, allowed={secret_file}) + _leaks(reference, allowed={reference / "output.txt"})
    leaks += [f"train output: {name}" for name, value in PLANTED.items() if value in train_output]
    leaks += _output_leaks("export", export) + _output_leaks("bench", bench_run)
    assert not leaks, "secret values written or printed:\n" + "\n".join(leaks)
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert f"HF_TOKEN=$(cat {secret_file})\n" in env_file.read_text() and secret_file.read_text() == PLANTED["HF_TOKEN"]


def _hostfile_env_file(tmp_path: Path) -> Path:
    """The files `zero-kit train --hostfile` writes before its launcher starts, written as it writes them."""
    from zero_kit.train.options import TrainOptions
    from zero_kit.train.parent import relaunch_plan

    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    opts = TrainOptions(hostfile=str(hostfile), output=str(tmp_path / "hostfile_run"))
    plan = relaunch_plan(opts, None, 29500, environ={**os.environ, **PLANTED})
    printed = " ".join(plan.argvs[0])
    assert not any(value in printed for value in PLANTED.values())
    plan.write_files()
    return Path(plan.env["DS_ENV_FILE"])

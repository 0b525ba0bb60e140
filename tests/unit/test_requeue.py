"""Slurm's own requeue (node failure, preemption, `scontrol requeue`) runs the sbatch script again from its top with the
same arguments and SLURM_RESTART_COUNT set: the script zero-kit writes says so and asks for requeue, and `zero-kit
train` then continues from the job's own newest complete checkpoint, never starting over. The real thing runs on the
two-node Slurm rig (tests/multinode/test_cluster_faults.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from zero_kit.checkpoints import store
from zero_kit.launch import SlurmJob, sbatch_script
from zero_kit.train.options import TrainOptions
from zero_kit.train.resume import JOB_ID_KEY, continue_requeued_job, resume_target


def _run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The script zero-kit writes, run by bash with stand-ins for the venv, scontrol and srun (srun prints its
    arguments): what a node runs, without Slurm."""
    venv, bin_dir = tmp_path / "venv", tmp_path / "stubs"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    bin_dir.mkdir()
    # a large allocation's host list: more than a pipe holds, so a reader that stops early (head -n 1) would kill
    # scontrol with SIGPIPE, which pipefail turns into the script's failure
    hosts = "echo node0; i=1; while [ $i -lt 20000 ]; do echo node$i; i=$((i+1)); done"
    for name, body in (("scontrol", hosts), ("srun", 'echo "srun $*"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    job = SlurmJob(nodes=2, gpus_per_node=1, launcher="srun", module="zero_kit.cli", venv=str(venv),
                   args=("train", "--resume", "never", "--output", "o"))  # fmt: skip
    script = tmp_path / "train.sbatch"
    script.write_text(sbatch_script(job))
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[0-1]"}
    return subprocess.run(["bash", str(script)], env={**base, **env}, capture_output=True, text=True, timeout=10)


def test_sbatch_script_asks_for_requeue_and_keeps_the_output_of_earlier_runs():
    job = SlurmJob(nodes=2, gpus_per_node=8, launcher="deepspeed", module="zero_kit.cli", args=("train",))
    lines = sbatch_script(job).splitlines()
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    assert "#SBATCH --requeue" in sbatch and "#SBATCH --open-mode=append" in sbatch
    # sbatch reads #SBATCH lines only before the first command
    assert lines.index(sbatch[-1]) < lines.index("set -euo pipefail")


def test_a_restarted_script_says_which_restart_of_which_job(tmp_path):
    first = _run_script(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "requeued" not in first.stderr + first.stdout
    assert "srun python -u -m zero_kit.cli train --resume never --output o" in first.stdout
    again = _run_script(tmp_path / "again", SLURM_RESTART_COUNT="2")
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip() == "zero-kit: requeued: restart 2 of job 7 on node[0-1]"
    assert "srun python -u -m zero_kit.cli train --resume never --output o" in again.stdout


def _complete_checkpoint(output: Path, step: int, job_id: str | None) -> Path:
    ckpt = output / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "weights.bin").write_bytes(b"w" * 16)
    (ckpt / store.RUN_INFO).write_text(json.dumps({"options": {}, JOB_ID_KEY: job_id}))
    store.write_manifest(ckpt, step=step, world_size=2)
    return ckpt


def _requeued(**env: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": "7", **env}


def test_a_requeued_job_continues_its_own_checkpoint_whatever_resume_says(tmp_path, capsys):
    out = tmp_path / "run"
    _complete_checkpoint(out, 2, "7")
    own = _complete_checkpoint(out, 4, "7")
    for resume in ("never", str(tmp_path / "elsewhere" / "checkpoint-9")):
        opts = continue_requeued_job(
            TrainOptions(output=str(out), resume=resume), _requeued(SLURM_RESTART_COUNT="1"), True
        )
        assert opts.resume == str(own) and resume_target(opts) == own
        assert f"requeued by Slurm: restart 1 of job 7; continuing from {own}" in capsys.readouterr().err
    auto = TrainOptions(output=str(out))
    assert continue_requeued_job(auto, _requeued(SLURM_RESTART_COUNT="3"), False) is auto
    assert capsys.readouterr().err == ""


def test_a_first_run_or_another_jobs_checkpoint_keeps_resume_as_given(tmp_path, capsys):
    out = tmp_path / "run"
    _complete_checkpoint(out, 6, "5")  # an earlier job's: `--resume never` must still delete it
    never = TrainOptions(output=str(out), resume="never")
    for env in (_requeued(), _requeued(SLURM_RESTART_COUNT="0"), {"SLURM_RESTART_COUNT": "1"}):
        assert continue_requeued_job(never, env, True) is never
    assert capsys.readouterr().err == ""
    assert continue_requeued_job(never, _requeued(SLURM_RESTART_COUNT="1"), True) is never
    assert "restart 1 of job 7; --resume never as given" in capsys.readouterr().err
    os.remove(out / "checkpoint-6" / store.MANIFEST)  # a cut-short save is no checkpoint of the job either
    assert continue_requeued_job(never, _requeued(SLURM_RESTART_COUNT="1"), False) is never

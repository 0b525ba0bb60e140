"""Unit tests for zero_kit.launch and `zero-kit launch`: commands, hostfiles and sbatch scripts it writes."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from zero_kit.cli import main
from zero_kit.errors import UserError
from zero_kit.launch import (
    SlurmJob,
    deepspeed_command,
    hostfile_text,
    parse_hostfile,
    sbatch_script,
    torchrun_command,
)


def test_deepspeed_command_per_node_uses_no_ssh_and_node_rank():
    cmd = deepspeed_command("m", ["--x", "1"], nproc=8, master_port=29700, hostfile="hf", node_rank=1,
                            master_addr="10.0.0.1", launcher="deepspeed")  # fmt: skip
    assert cmd[:7] == ["deepspeed", "--hostfile", "hf", "--no_ssh", "--node_rank", "1", "--master_addr"]
    assert cmd[-4:] == ["--module", "m", "--x", "1"]
    local = deepspeed_command("m", [], nproc=2, master_port=29701)
    assert local[0].endswith("/deepspeed") and local[1:3] == ["--num_gpus", "2"]


def test_torchrun_command_is_the_venv_module_with_static_rendezvous():
    cmd = torchrun_command("m", ["a"], nproc=2, master_port=29702, nnodes=2, node_rank=1, master_addr="h0")
    assert cmd[0] == sys.executable and cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--node_rank") + 1] == "1"
    assert cmd[-3:] == ["-m", "m", "a"]


def test_hostfile_round_trip_and_all_bad_lines_reported_at_once():
    text = hostfile_text(["node1", "10.0.0.2"], 4)
    assert parse_hostfile(text) == [("node1", 4), ("10.0.0.2", 4)]
    with pytest.raises(UserError) as err:
        parse_hostfile("node1 slots=2\nnode2 slots=x\n# comment\nnode3\n")
    assert "hostfile:2" in str(err.value) and "hostfile:4" in str(err.value)
    with pytest.raises(UserError):
        hostfile_text(["bad host"], 1)


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun"])
def test_sbatch_script_is_valid_bash_with_one_srun_task_per_node(launcher, tmp_path):
    job = SlurmJob(nodes=4, gpus_per_node=8, launcher=launcher, module="zero_kit.bench",
                   args=("--strategy", "zero3", "--options-json", '{"steps": 5}'))  # fmt: skip
    script = sbatch_script(job)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert "#SBATCH --nodes=4" in script and "#SBATCH --ntasks-per-node=1" in script
    srun = next(line for line in script.splitlines() if line.startswith("srun"))
    words = shlex.split(srun)
    # no --kill-on-bad-exit: it would SIGTERM the other ranks (preemption to them) and hide the failed rank's code
    assert not any(word.startswith(("--kill-on-bad-exit", "-K")) for word in words)
    inner = shlex.split(words[words.index("-c") + 1])
    # The user's arguments survive quoting: they follow the inner command as "$@".
    assert words[-4:] == ["--strategy", "zero3", "--options-json", '{"steps": 5}']
    if launcher == "deepspeed":
        assert inner[0] == "deepspeed" and "--no_ssh" in inner and "$SLURM_NODEID" in inner
    else:
        assert inner[:3] == ["python", "-m", "torch.distributed.run"] and inner[inner.index("--nnodes") + 1] == "4"


def test_sbatch_script_with_srun_starts_every_rank_itself(tmp_path):
    """No launcher between Slurm and the ranks: their exit code (75 preempted) is the job's."""
    job = SlurmJob(nodes=2, gpus_per_node=4, launcher="srun", module="zero_kit.cli", args=("train", "--output", "o p"))
    script = sbatch_script(job)
    (tmp_path / "job.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], capture_output=True).returncode == 0
    assert "#SBATCH --ntasks-per-node=4" in script and "deepspeed" not in script
    srun = shlex.split(next(line for line in script.splitlines() if line.startswith("srun")))
    assert srun == ["srun", "python", "-u", "-m", "zero_kit.cli", "train", "--output", "o p"]


def test_cli_defaults_to_srun_for_train_and_deepspeed_otherwise(tmp_path):
    script = tmp_path / "s.sbatch"
    assert main(["launch", "--slurm", "-o", str(script), "--", "train", "--stage", "3"]) == 0
    assert "srun python -u -m zero_kit.cli train" in script.read_text()
    assert main(["launch", "--slurm", "-o", str(script), "--", "--strategy", "zero3"]) == 0
    assert "deepspeed --hostfile" in script.read_text()
    assert main(["launch", "--slurm", "--launcher", "deepspeed", "-o", str(script), "--", "train"]) == 0
    assert "--no_ssh" in script.read_text()
    assert main(["launch", "--hostfile", str(script), "--launcher", "srun", "--", "train"]) == 2


def test_cli_writes_hostfile_and_sbatch_and_prints_per_node_commands(tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    assert main(["launch", "--write-hostfile", str(hostfile), "--hosts", "a,b", "--gpus-per-node", "2"]) == 0
    assert parse_hostfile(hostfile.read_text()) == [("a", 2), ("b", 2)]
    script = tmp_path / "run.sbatch"
    assert main(["launch", "--slurm", "--nodes", "2", "--launcher", "torchrun", "-o", str(script), "--", "--x"]) == 0
    assert script.read_text().startswith("#!/bin/bash")
    capsys.readouterr()
    assert main(["launch", "--hostfile", str(hostfile), "--", "--strategy", "zero3"]) == 0
    out = capsys.readouterr().out
    assert "# on a" in out and "--node_rank 1" in out and out.count("--no_ssh") == 2


def test_cli_reports_a_bad_hostfile_without_traceback(tmp_path, capsys):
    bad = tmp_path / "hf"
    bad.write_text("node1 slots=zero\n")
    assert main(["launch", "--hostfile", str(bad)]) == 2
    assert "fix:" in capsys.readouterr().err
    assert main(["launch", "--hostfile", str(tmp_path / "missing")]) == 2


def test_checked_in_launch_files_are_what_zero_kit_launch_writes(tmp_path):
    from benchmarks.launch_files import generate

    for path in generate.generate(tmp_path):
        name = path.relative_to(tmp_path)
        assert path.read_text() == (generate.HERE / name).read_text(), (
            f"benchmarks/launch_files/{name} is stale: regenerate it (python -m benchmarks.launch_files.generate)"
        )
        if path.suffix == ".sbatch":
            assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0

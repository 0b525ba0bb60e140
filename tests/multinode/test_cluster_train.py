"""`zero-kit train` through the cluster launch paths, for real on two hosts (network namespaces, root):

- SLURM: `zero-kit launch --slurm -- train ...` writes the sbatch script; `sbatch --wait` on the two-node Slurm
  rig trains ZeRO-3 (deepspeed launcher, --no_ssh per node) and ZeRO-2 (torchrun per node) across both nodes
  and exports a Hugging Face directory;
- pdsh/ssh: `zero-kit train --hostfile H` on the first host starts a rank on each host through DeepSpeed's
  default launcher, trains ZeRO-3 and exports;
- one job per output across the two hosts (issue 39; the same filesystem, each host its own name): a run started
  on the second host and killed with SIGKILL leaves a claim the first host refuses while its heartbeat is fresh
  and takes over once it is older than STALE_S; while that launch trains, the same command on the second host is
  refused in seconds, in one line naming the holder on the first host, and changes nothing. Joined into the pdsh
  training launch (one rig, one training launch);
- a rank failing on the remote node (exit 3) comes back as the job's exit code in both paths.

Prefixes zkcs (Slurm, 10.78.51.x) and zkcp (pdsh, 10.78.52.x). Ports 29870-29879.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rigs import slurm_cluster, ssh_hosts, write_hostfile
from tests.rigs.base import namespace_pids, rig_env
from tests.support.jobs import FAULTS_SITE, VENV, pythonpath_with, run, start, wait_for, zero_kit
from tests.support.jobs import env as job_env
from tests.support.rigs import rig_marks
from tests.support.runs import assert_trained, logged_steps
from zero_kit.checkpoints import claim
from zero_kit.launch.hostfile import rank_env
from zero_kit.train.plan import RunPlan

pytestmark = rig_marks()
STEPS = 3
JOB = ["--max-steps", str(STEPS), "--max-length", "64", "--micro-batch", "2", "--stall-timeout", "60"]


def _zero_kit(*args: str, cwd: Path) -> None:
    run(zero_kit(*args), timeout=60, cwd=cwd)


def _assert_trained_and_exported(out: Path, stage: int) -> None:
    assert_trained(out, STEPS, world_size=2, stage=stage)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "final")
    assert all(t.numel() > 0 for t in model.state_dict().values())


def _fault_env(code: int) -> dict[str, str]:
    path = pythonpath_with(FAULTS_SITE)
    return rig_env(PYTHONPATH=path, ZERO_KIT_FAULT_EXIT_RANK="1", ZERO_KIT_FAULT_EXIT_CODE=str(code))


@pytest.mark.parametrize(("launcher", "stage", "port"), [("deepspeed", 3, 29870), ("torchrun", 2, 29871)])
def test_slurm_sbatch_trains_across_two_nodes_and_exports(tmp_path, cpu_ops, launcher, stage, port):
    script = tmp_path / "train.sbatch"
    _zero_kit("launch", "--slurm", "--nodes", "2", "--gpus-per-node", "1", "--launcher", launcher,
              "--master-port", str(port), "--venv", str(VENV), "--time", "00:10:00", "-o", str(script),
              "--", "train", "--stage", str(stage), "--output", str(tmp_path / "run"), *JOB, cwd=tmp_path)  # fmt: skip
    with slurm_cluster("zkcs", subnet=51) as cluster:
        done = cluster.sbatch_wait(script, timeout=420, cwd=tmp_path)
        logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
        assert done.returncode == 0, done.stdout + done.stderr + logs[-4000:]
    _assert_trained_and_exported(tmp_path / "run", stage)


def test_slurm_job_exit_code_is_the_remote_ranks(tmp_path, cpu_ops):
    script = tmp_path / "train.sbatch"
    _zero_kit("launch", "--slurm", "--nodes", "2", "--gpus-per-node", "1", "--master-port", "29872",
              "--venv", str(VENV), "-o", str(script), "--", "train", "--stage", "3", "--no-export",
              "--output", str(tmp_path / "run"), *JOB, cwd=tmp_path)  # fmt: skip
    with slurm_cluster("zkcs", subnet=51) as cluster:
        done = cluster.sbatch_wait(script, timeout=420, cwd=tmp_path, env=_fault_env(3))
    logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert "[fault] rank 1 exits 3" in logs, logs[-4000:]
    assert done.returncode == 3, logs[-4000:]


def _pdsh_argv(rig, tmp_path: Path, port: int, *extra: str) -> list[str]:
    hostfile = write_hostfile(tmp_path / "hostfile", rig.hosts.names)
    return [*zero_kit("train"), "--hostfile", str(hostfile), "--master-port", str(port),
            "--stage", "3", "--output", str(tmp_path / "run"), *JOB, *extra]  # fmt: skip


def _on_host(rig, node: int, argv: list[str]) -> list[str]:
    """`argv` on host `node` under that host's own name, as on a cluster: host 0 in its network namespace and a
    UTS namespace named after it (where the launcher runs), host 1 over ssh (its sshd's namespaces), with the
    variables a rank started there gets (zero_kit.launch.hostfile.rank_env)."""
    name = rig.hosts.names[node]
    if node == 0:
        return rig.command(["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv])
    variables = {**rank_env(job_env(), user_file=Path("/nonexistent")), "PYTHONUNBUFFERED": "1"}
    if os.environ.get("PYTHONPATH"):
        variables["PYTHONPATH"] = os.environ["PYTHONPATH"]
    remote = f"exec env {' '.join(shlex.quote(f'{k}={v}') for k, v in variables.items())} {shlex.join(argv)}"
    return rig.command(["ssh", name, remote])


def _pdsh_train(rig, tmp_path: Path, port: int, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = _on_host(rig, 0, _pdsh_argv(rig, tmp_path, port, *extra))
    return subprocess.run(argv, capture_output=True, text=True, timeout=420, cwd=tmp_path, env=env or rig_env())


def _timed(argv: list[str], timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=rig_env())
    return done, time.monotonic() - began


def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def _sshd_daemons(rig) -> set[int]:
    return {int((rig.root / f"sshd{node}.pid").read_text().split()[0]) for node in (0, 1)}


def _signal_hosts(rig, sig: int, signalled: list[int] | None = None) -> list[int]:
    """`sig` to every process on both hosts but the two sshd daemons (a job's launcher, pdsh and its ssh sessions,
    ranks), again until none is new (one may fork meanwhile); the pids signalled, added to `signalled`."""
    daemons, signalled = _sshd_daemons(rig), [] if signalled is None else signalled
    while fresh := [p for n in rig.hosts.names for p in namespace_pids(n) if p not in daemons and p not in signalled]:
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            signalled.append(pid)
    return signalled


def _killed_on_host1(rig, argv: list[str], out: Path, log: Path) -> claim.Holder:
    """`argv` started on host 1 and, as soon as its claim names it, killed with SIGKILL with everything it started
    on either host (its launch follows the claim within milliseconds): the claim it leaves is a dead node's."""
    job = start(_on_host(rig, 1, argv), log, env=rig_env())
    holder = wait_for(lambda: claim.read(out / claim.CLAIM), "the claim of the run on zkcp1", job, timeout=60)
    assert holder.pid in _signal_hosts(rig, signal.SIGKILL) and holder.host == "zkcp1", holder
    job.wait(timeout=30)
    daemons = _sshd_daemons(rig)
    wait_for(lambda: {p for n in rig.hosts.names for p in namespace_pids(n)} <= daemons, "the killed run gone")
    assert "Traceback" not in job.text(), job.text()[-3000:]
    return holder


def _stopped(pid: int) -> bool:
    """Every thread of `pid` stopped (one in the middle of a write stops after it), or the process gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return all((task / "stat").read_text().rsplit(")", 1)[1].split()[0] in "TtZX" for task in tasks)
    except OSError:
        return True


@contextlib.contextmanager
def _frozen(rig) -> Iterator[None]:
    """Every process on both hosts but the sshd daemons stopped with SIGSTOP (the launcher, pdsh and its ssh
    sessions, the ranks, the claim's heartbeat): the output can change only through a command started inside.
    SIGCONT after, also on failure."""
    frozen: list[int] = []
    try:
        _signal_hosts(rig, signal.SIGSTOP, frozen)
        wait_for(lambda: all(map(_stopped, frozen)), "every process on the hosts stopped", timeout=30)
        yield
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_hostfile_launch_trains_on_both_hosts_over_pdsh_and_exports(tmp_path, cpu_ops):
    """Also one job per output across the two hosts (issue 39), in the same launch: it takes over the claim of a
    run killed on zkcp1 once that claim's heartbeat is stale (refused while it is fresh), and while it trains the
    same command on zkcp1 is refused in one line naming it and changes nothing."""
    out = tmp_path / "run"
    with ssh_hosts("zkcp", subnet=52) as rig:
        argv = _pdsh_argv(rig, tmp_path, 29873)
        dead = _killed_on_host1(rig, argv, out, tmp_path / "killed.log")
        # another host's holder lives while its heartbeat does (flock may be local to each host on a shared
        # filesystem), even where its pid runs nowhere
        early, early_s = _timed(_on_host(rig, 0, argv))
        assert early.returncode == 2 and f"(pid {dead.pid} on zkcp1, since " in early.stderr, early.stderr[-3000:]
        stale = time.time() - claim.STALE_S - 30  # the last heartbeat of a node that died 2.5 minutes ago
        os.utime(out / claim.CLAIM, (stale, stale))

        job = start(_on_host(rig, 0, argv), tmp_path / "train.log", cwd=tmp_path, env=rig_env())
        wait_for(lambda: logged_steps(out), "the run's first logged step", job, timeout=360)
        with _frozen(rig):
            live = claim.read(out / claim.CLAIM)
            assert live is not None and (live.host, live.pid) == ("zkcp0", job.proc.pid), (live, job.text()[-3000:])
            before = _tree(out)
            refused, refused_s = _timed(_on_host(rig, 1, argv))
            after = _tree(out)
        code = job.wait(timeout=360)
    print(f"\n[claim] refused on zkcp0 in {early_s:.1f} s, on zkcp1 in {refused_s:.1f} s")
    log = job.text()
    assert code == 0, log[-4000:]
    assert "zkcp1: " in log, "the second host ran no rank"
    took = [line for line in log.splitlines() if "took over" in line]
    gone = f"zero-kit train: took over {out} from a run that is gone (pid {dead.pid} on zkcp1, "
    assert len(took) == 1 and took[0].startswith(gone), took

    assert refused.returncode == 2 and refused_s < 15, (refused.returncode, refused_s, refused.stderr[-3000:])
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and refused.stdout == "" and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    held = f"zero-kit train: error: --output {out} is in use by another run (pid {job.proc.pid} on zkcp0, since "
    assert lines[0].startswith(held) and f"stop it with `kill {job.proc.pid}` on zkcp0" in lines[0], lines[0]
    assert after == before  # nothing written, deleted or touched by the refused run

    env_file = (out / ".deepspeed_env").read_text()
    assert "TORCH_EXTENSIONS_DIR=" in env_file and "\n\n" not in env_file and "GLOO_SOCKET_IFNAME" not in env_file
    planned = dict(line.split("=", 1) for line in env_file.splitlines())  # the ranks' plan, over pdsh
    # rank 0, on zkcp0 over ssh, checked the plan's claim token (claim.check_handed)
    assert RunPlan.from_env(planned).claim_token == live.token
    assert logged_steps(out) == list(range(1, STEPS + 1)) and not (out / claim.CLAIM).exists()
    _assert_trained_and_exported(out, 3)


def test_hostfile_launch_exit_code_is_the_remote_ranks(tmp_path, cpu_ops):
    with ssh_hosts("zkcp", subnet=52) as rig:
        done = _pdsh_train(rig, tmp_path, 29874, "--no-export", env=_fault_env(3))
    log = done.stdout + done.stderr
    assert "[fault] rank 1 exits 3" in log, log[-4000:]
    assert done.returncode == 3, log[-4000:]

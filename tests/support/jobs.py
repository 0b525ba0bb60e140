"""Running `zero-kit` and other commands from tests: one-shot commands that must succeed, background jobs in their
own session (so a test can kill the launcher and every rank at once) with their output in a log file, and waiting
for a condition while such a job runs."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil

from tests.rigs.base import RigError, wait_until

T = TypeVar("T")
VENV = Path(sys.executable).parent.parent
VENV_BIN = VENV / "bin"
TESTS = Path(__file__).resolve().parents[1]
# Folders whose sitecustomize.py every Python process of a job runs first (see each): pass one as `site`.
PROBE_SITE = TESTS / "dist" / "probe"  # ZERO_KIT_PROBE_LOGITS: the logits every rank computed
FAULTS_SITE = TESTS / "dist" / "reliability_faults"  # ZK_FAULT_* / ZERO_KIT_FAULT_*: pauses and exits on cue
# Small and quick: the embedded tiny model, short sequences, 2 examples per rank, a log line every step.
FAST = ["--max-length", "64", "--micro-batch", "2", "--log-steps", "1"]


def zero_kit(*args: str) -> list[str]:
    """The argv of this venv's `zero-kit` console script."""
    return [str(VENV_BIN / "zero-kit"), *args]


def env(site: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment, offline and unbuffered, plus `extra`. `site`: a folder whose sitecustomize.py
    every Python process of the job runs first (a probe or an injected fault), put ahead on PYTHONPATH so the
    worktree's own PYTHONPATH survives behind it."""
    base = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if site is not None:
        base["PYTHONPATH"] = pythonpath_with(site)
    return {**base, **extra}


def pythonpath_with(site: Path) -> str:
    """PYTHONPATH with `site` first and this process's PYTHONPATH (the worktree under test) after it."""
    return os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def run(
    cmd: list[str],
    *,
    timeout: int = 240,
    extra_env: dict | None = None,
    site: Path | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run `cmd` to the end; it must exit 0 (the failure shows the ends of its stdout and stderr)."""
    run_env = env(site, **(extra_env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=run_env, cwd=cwd)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@dataclass
class Job:
    """A command running in its own session, its stdout and stderr in `log`. With `reap` set, `wait` SIGKILLs what
    is left of the session after the launcher returns (leftover ranks would hold ports and files of the next run);
    without it a test can still look for leftovers itself."""

    proc: subprocess.Popen
    log: Path
    reap: bool = False
    started: float = field(default_factory=time.monotonic)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.reap:
                kill_group(self.proc)


def start(argv: list[str], log: Path, *, cwd: Path | None = None, env: dict | None = None, reap: bool = False) -> Job:
    """`argv` in a new session, output to `log`, in the background."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Job(proc, log, reap)


def shm_left(*ports: int | str) -> list[Path]:
    """DeepSpeed's shm all-reduce workspaces a launch on these master ports left in /dev/shm, any address and rank
    (named as zero_kit.launch.ops.shm_buffer names them). Empty where the shm op was kept from starting."""
    from zero_kit.launch.ops import SHM_DIR, shm_buffer

    names = [shm_buffer("*", {"MASTER_ADDR": "*", "MASTER_PORT": str(port)}).name for port in ports]  # type: ignore[arg-type]
    return [path for name in names for path in SHM_DIR.glob(name)]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL every process of the job's session (launcher and ranks): what an OOM killer or a node loss does."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A free port that this process listens on for the block, as another job's rendezvous would hold it."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        yield sock.getsockname()[1]


class Descendants:
    """Every process the job started, seen while it runs (a leftover may have lost its parent by the end)."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.seen: dict[int, psutil.Process] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.is_set():
            try:
                self.seen.update((p.pid, p) for p in self.root.children(recursive=True))
            except psutil.Error:
                return
            time.sleep(0.05)

    def alive(self) -> list[str]:
        self.done.set()
        self.thread.join(5)
        left = []
        for proc in self.seen.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(" ".join(proc.cmdline()[:6]))
                    proc.kill()  # do not leave it to the next test; the assertion reports it
            except psutil.Error:
                continue
        return left


def assert_stopped_cleanly(
    text: str, out: Path, step: int, code: int, last_line: str, left: list[str], pgid: int
) -> str:
    """The checks of a `zero-kit train` a signal stopped at `step` with exit `code`: no traceback, no process of the
    job left (`left`: what `Descendants.alive` found; `pgid`: its session), and the last line, printed once, starts
    with `last_line` and names the step, the code, the checkpoint left and the command that continues, which this
    returns."""
    assert "Traceback" not in text, text[-3000:]
    assert left == [] and survivors(pgid) == [], f"outlived the command: {left}"
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[-1].startswith(last_line), text[-3000:]
    assert sum("zero-kit train: stopped by" in line or "zero-kit train: preempted" in line for line in lines) == 1
    assert f" at step {step}, exit {code}; checkpoint left: {out / f'checkpoint-{step}'} (" in lines[-1], lines[-1]
    command = lines[-1].split("; continue with: ")[1]
    assert command.endswith(" --resume auto") and command.startswith("zero-kit train --nproc 2 "), command
    return command


def survivors(pgid: int, grace: float = 5.0) -> list[int]:
    """Live processes still in the process group `pgid` (a job's session leader's pid), after up to `grace` seconds
    for members already on their way out: a rank killed with SIGKILL leaves only once the kernel has freed its
    memory or its system call returns, a moment after its leader was reaped (CI once listed one such rank)."""
    deadline = time.monotonic() + grace
    while True:
        found = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p.pid)
            except (ProcessLookupError, psutil.Error):
                continue
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def wait_for(
    condition: Callable[[], T], what: str, job: Job | None = None, timeout: float = 300, poll: float = 0.02
) -> T:
    """Poll `condition()` until it returns something truthy and return that; fail (with the end of the job's log)
    when time runs out or the job ends first."""

    def gone() -> str:
        code = job.proc.poll() if job is not None else None
        return "" if code is None else f"job exited {code}"

    try:
        return wait_until(condition, timeout, what, interval=poll, gone=gone)
    except RigError as exc:
        raise AssertionError(f"{exc}" + (f"\n{job.text()[-3000:]}" if job else "")) from None

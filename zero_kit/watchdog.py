"""The stall watchdog: a job in which no rank makes progress for `--stall-timeout` seconds is ended, on every
node, with EXIT_STALLED and a report naming each rank's last phase.

Why outside the training loop: a rank stuck in a collective (a peer frozen, a cut link) never returns to Python,
and on gloo nothing times out reliably (a SIGSTOPped peer kept a job alive past 150 s with a 30 s collective
timeout). So the moving parts are:

- heartbeats: each rank writes DIR/rank{r}.json (atomic rename: phase, step, time, host, pid) at step
  boundaries and when it enters a long phase (startup, save, export), which get a longer allowance. A
  heartbeat is progress, never a timer: a rank stuck anywhere stops beating. Step beats of an unchanged phase
  are written at most once a second (a tenth of the timeout, if less; the watcher thread writes the last one);
  each keeps the time of the progress it records.
- a guardian process per rank (`python -m zero_kit.watchdog`, its own process, so it keeps running when its rank is
  frozen or blocked): it reads every rank's heartbeat from DIR (a filesystem all nodes share, as checkpoints need
  anyway); when every unfinished rank is past its allowance, the first guardian to notice writes DIR/STALLED (the
  report) and all guardians end their ranks.
- a watcher thread in each rank: on STALLED the rank prints the report and leaves with EXIT_STALLED itself
  (os._exit works from a thread while the main thread waits in C++). A rank that cannot (SIGSTOPped, hung
  with the GIL held) is killed by its guardian a few seconds later; its launcher then ends the node.

Works on gloo and NCCL alike (it never talks over the process group) and across nodes (every node's guardians
read the same directory). Clocks of different nodes are assumed synchronized (NTP) to well under the timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from zero_kit.log import warn

EXIT_STALLED = 76
"""Exit code of a job the watchdog ended (EX_PROTOCOL in sysexits.h; 75 is a preempted job)."""
LONG_PHASES = ("startup", "save", "export")
LONG_PHASE_FACTOR = 6
"""Long phases may take this many times --stall-timeout (model loading, first step's compilation, a save)."""
MARKER = "STALLED"
HEARTBEAT_DIR = ".zero_kit_heartbeat"
"""Where a job keeps its heartbeats, inside its output directory (shared by every node, like the checkpoints)."""
POLL_S = 1.0
WRITE_EVERY_S = 1.0
"""A started heartbeat writes beats of an unchanged phase at most this often (at most a tenth of --stall-timeout
apart); the beats between are kept in memory, each with its own time, and the watcher thread writes the last one
within POLL_S. A phase change is written at once."""
KILL_GRACE_S = 5.0
KEEP_ALIVE_LIMIT_S = 3600.0
"""The longest a live wait (an op build this rank runs or waits for) is beaten for; longer is a stall again."""
_started: Heartbeat | None = None  # this process's heartbeat, for work deep below the job (op builds)


def nccl_watchdog_env(stall_timeout: float) -> dict[str, str]:
    """What NCCL offers on GPUs, set before the process group exists (gloo ignores them): a failed or timed-out
    collective aborts the communicator instead of hanging (async error handling), and torch's own NCCL
    heartbeat monitor ends a rank whose NCCL watchdog thread is stuck, on the same timeout as ours."""
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    if stall_timeout > 0:
        env |= {"TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(int(stall_timeout))}
    return env


def allowance(phase: str, stall_timeout: float) -> float:
    return stall_timeout * (LONG_PHASE_FACTOR if phase in LONG_PHASES else 1)


@dataclass
class Heartbeat:
    """One rank's side: beats, its watcher thread, its guardian process."""

    directory: Path
    rank: int
    world_size: int
    stall_timeout: float
    write_every_s: float = 0.0
    """A beat in the phase last written waits up to this long for the next beat or a `flush` to write it, with its
    own time (0: every beat is written at once). `start` sets it: WRITE_EVERY_S, at most a tenth of the timeout."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _pending: dict | None = field(default=None, init=False, repr=False, compare=False)
    _written: tuple[str, float] = field(default=("", float("-inf")), init=False, repr=False, compare=False)

    def start(self) -> Heartbeat:
        global _started
        self.directory.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self.phase, self.step = "startup", 0
        _started = self
        self.beat("startup", 0)
        self._guardian = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zero_kit.watchdog",
                str(self.directory),
                str(self.rank),
                str(self.world_size),
                str(self.stall_timeout),
                str(os.getpid()),
                str(self.started),
            ],  # fmt: skip
            stdin=subprocess.DEVNULL,
        )
        # the watcher thread writes what waits: the beats between writes can wait (benchmarks/train_overhead)
        self.write_every_s = min(WRITE_EVERY_S, self.stall_timeout / 10)
        threading.Thread(target=self._watch, name="zero-kit-stall-watch", daemon=True).start()
        return self

    def beat(self, phase: str, step: int) -> None:
        """Progress now: `phase` at `step`. Written at once when the phase changes (a long phase's allowance is in
        the file before the phase starts) or `write_every_s` after the last write; otherwise it waits, with this
        time, for a later beat or the watcher thread. WHY: rewriting a file waits for the disk on ext4 (it flushes
        a file replaced by rename): 0.4-4 ms a beat on a shared virtual disk, at every step of a fast loop up to a
        few % of its step time. The file is at most write_every_s (<= --stall-timeout / 10) behind the rank."""
        record = {"rank": self.rank, "phase": phase, "step": step, "time": time.time(),
                  "host": socket.gethostname(), "pid": os.getpid()}  # fmt: skip
        with self._lock:  # keep_alive and the watcher write from threads: the newest record is the last written
            self.phase, self.step = phase, step
            self._pending = record
            last_phase, last_at = self._written
            if phase != last_phase or time.monotonic() - last_at >= self.write_every_s:
                self._write_pending()

    def flush(self) -> None:
        """Write the beat that waits, if any."""
        with self._lock:
            if self._pending is not None:
                self._write_pending()

    def _write_pending(self) -> None:
        record = self._pending
        path = self.directory / f"rank{self.rank}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)
        self._pending, self._written = None, (record["phase"], time.monotonic())

    def stop(self) -> None:
        """The rank finished (or failed on its own): no more stall checks for it; its guardian leaves on its next
        look (it ignores SIGTERM, see `guard`)."""
        self.beat("done", -1)

    @contextmanager
    def keep_alive(self, phase: str, limit_s: float = KEEP_ALIVE_LIMIT_S) -> Iterator[None]:
        """Beat `phase` from a thread while this rank does something long that is known to be alive (an op build
        that compiles, or waits on a build another live process holds), for at most `limit_s`; then the phase
        the rank was in before. WHY: a first op build takes minutes on a few cores, longer than a short
        --stall-timeout's start-up allowance, yet it is progress; a dead lock never gets here (ops clears it)."""
        before = (self.phase, self.step)
        done = threading.Event()

        def beat_until_done() -> None:
            deadline = time.monotonic() + limit_s
            while not done.wait(min(10.0, max(self.stall_timeout / 4, 0.5))) and time.monotonic() < deadline:
                self.beat(phase, before[1])

        self.beat(phase, before[1])
        thread = threading.Thread(target=beat_until_done, name="zero-kit-keep-alive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.beat(*before)

    def _watch(self) -> None:
        while True:
            report = read_marker(self.directory, self.started)
            if report is not None:
                warn(f"zero-kit: rank {self.rank} stops: {report}")
                os._exit(EXIT_STALLED)
            with suppress(OSError):  # a full disk: the rank's next beat raises it where the run names it
                self.flush()
            time.sleep(POLL_S)


@contextmanager
def keep_alive(phase: str) -> Iterator[None]:
    """`Heartbeat.keep_alive` of this process's heartbeat, if it started one (nothing to do otherwise)."""
    if _started is None:
        yield
        return
    with _started.keep_alive(phase):
        yield


def read_marker(directory: Path, since: float) -> str | None:
    """The stall report of this run (a marker older than `since` is a previous run's)."""
    path = directory / MARKER
    try:
        if path.stat().st_mtime < since - 1:
            return None
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def read_beats(directory: Path, world_size: int, since: float) -> dict[int, dict | None]:
    """Each rank's latest heartbeat of this run (None: not written yet in this run)."""
    beats: dict[int, dict | None] = {}
    for rank in range(world_size):
        try:
            beat = json.loads((directory / f"rank{rank}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            beat = None
        beats[rank] = beat if beat and beat.get("time", 0) >= since - 1 else None
    return beats


def stalled(beats: dict[int, dict | None], stall_timeout: float, now: float, since: float) -> bool:
    """True when every unfinished rank is past its phase's allowance (a rank not seen yet counts from `since`)."""
    ages = []
    for beat in beats.values():
        if beat is None:
            ages.append(now - since > allowance("startup", stall_timeout))
        elif beat["phase"] != "done":
            ages.append(now - beat["time"] > allowance(beat["phase"], stall_timeout))
    return bool(ages) and all(ages)


def describe(beats: dict[int, dict | None], stall_timeout: float, now: float) -> str:
    """The report: how long nothing moved, and each unfinished rank's last phase (and its process, when local)."""
    here = socket.gethostname()
    parts = []
    for rank, beat in sorted(beats.items()):
        if beat is None:
            parts.append(f"rank {rank}: no heartbeat yet")
            continue
        if beat["phase"] == "done":
            continue
        state = _process_state(beat["pid"]) if beat.get("host") == here else ""
        parts.append(
            f"rank {rank} on {beat.get('host')}: last in {beat['phase']} at step {beat['step']},"
            f" {now - beat['time']:.0f} s ago{state}"
        )
    return f"no rank made progress for over {stall_timeout:g} s (--stall-timeout): " + "; ".join(parts)


def _process_state(pid: int) -> str:
    try:
        import psutil

        status = psutil.Process(pid).status()
    except Exception:  # gone, or psutil cannot tell: the report says nothing rather than guess
        return " (process gone)"
    # Waiting ("sleeping") is what every rank of a stalled job does; only a frozen or dead process is news.
    return {"stopped": " (process stopped: SIGSTOP?)", "zombie": " (process exited)"}.get(status, "")


def write_marker(directory: Path, report: str) -> bool:
    """Atomically create the marker; False when another guardian already did."""
    try:
        fd = os.open(directory / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(report + "\n")
    return True


def _add_to_marker(directory: Path, rank: int, pid: int) -> None:
    """Name a stopped rank in the report. Whichever guardian notices a stall first writes the report, and only the
    stopped rank's own host can see its state; its guardian adds it before the kill that lets its launcher end, so
    the report read after the job's end (`zero-kit train --hostfile`) always names it."""
    line = f"rank {rank} on {socket.gethostname()} (pid {pid}) was stopped (SIGSTOP?): SIGKILLed by its guardian"
    warn(f"zero-kit: stall watchdog: {line}")
    with open(directory / MARKER, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def _stopped(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except Exception:  # gone, or psutil cannot tell
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def guard(directory: Path, rank: int, world_size: int, stall_timeout: float, pid: int, since: float) -> int:
    """The guardian's loop: returns when its rank is gone or done, after ending it on a stall."""
    while _alive(pid):
        beats = read_beats(directory, world_size, since)
        if (beats.get(rank) or {}).get("phase") == "done":
            return 0
        now = time.time()
        if read_marker(directory, since) is None and stalled(beats, stall_timeout, now, since):
            report = describe(beats, stall_timeout, now)
            if write_marker(directory, report):
                warn(f"zero-kit: stall watchdog (rank {rank}'s guardian): {report}")
        if read_marker(directory, since) is not None:
            # A running rank's own watcher exits with EXIT_STALLED; a stopped one never will: no grace for it.
            stopped = _stopped(pid)
            if stopped:
                _add_to_marker(directory, rank, pid)
            deadline = time.monotonic() + (0 if stopped else KILL_GRACE_S)
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)  # frozen or hung: only SIGKILL ends a stopped process
            return EXIT_STALLED
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    # Launchers end a failed job with SIGTERM to every rank's process tree, then wait (the deepspeed launcher 30 s)
    # before SIGKILL: a SIGTERM pending on a stopped rank would hold the job that long. The guardian ignores it,
    # kills its stalled rank at once, and leaves when its rank is gone or done. Ctrl-C is the job's to handle.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    d, r, w, t, p, s = sys.argv[1:7]
    sys.exit(guard(Path(d), int(r), int(w), float(t), int(p), float(s)))

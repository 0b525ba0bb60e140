"""The one supervisor of a launch: starts its processes, forwards SIGINT and SIGTERM to the ranks, ends them all
when one fails or the time is up, and turns a stall into the watchdog's report and exit code. Ranks never outlive
it: whatever is left when it returns (also ranks a launcher put into sessions of their own) is killed.

Signals go to the ranks themselves (the processes whose `python -m` module is the launch's module), not to the
launchers between: the deepspeed launcher answers a SIGTERM by killing its ranks and exiting 1, so a preempted
rank could not save and exit 75; a launcher that started its ranks elsewhere (pdsh, ssh, srun) gets the signal
itself. After the first signal the ranks have a grace period (`grace`) to save and leave; then, or at a second
SIGINT (Ctrl-C pressed again, more than SAME_CTRL_C_S later), everything is killed at once. A launch ended by a
signal exits 128 + the signal's number (130 for SIGINT, 143 for SIGTERM) whatever its launchers returned, so a
shell sees what the user did.

With own_groups=False the launchers share our process group, so a terminal's Ctrl-C reaches them as well as the ranks
and us. They start with SIGINT blocked, and we decide what the signal does: the local deepspeed runner has no handler
of its own and would die with a traceback, orphaning its launcher; the deepspeed `launch.py` installs one that
SIGTERMs its ranks and SIGKILLs every rank still saving 30 s later (a checkpoint of a real model takes longer: the
Ctrl-C lost it). Blocked, not ignored: a handler a launcher installs does not unblock it, and the mask survives fork
and exec, so the ranks inherit it too until they install their own handlers and unblock it
(zero_kit.train.stopping, callbacks.PreemptionCallback); a rank that still blocks or ignores SIGINT is sent SIGTERM.

Every launcher is started with the parent-death signal (Linux prctl PR_SET_PDEATHSIG): SIGTERM when the thread that
started it dies, whatever killed us (kill -9, the OOM killer). The local deepspeed runner then dies; the pdsh one
kills its remote ranks. The ranks below a launcher watch the process that started the job themselves
(zero_kit.checkpoints.claim.bind_rank): a grandchild gets no parent-death signal from us.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from zero_kit.launch.placement import Launch
from zero_kit.log import warn
from zero_kit.metrics import GIB
from zero_kit.watchdog import EXIT_STALLED, read_marker

EXIT_TIMED_OUT = 124
"""Exit code of a launch ended by its overall timeout (what coreutils' `timeout` returns)."""
GRACE_S = 60.0
"""How long ranks have after a SIGINT or SIGTERM to finish their step, save and exit, before they are killed."""
RESEND_S = 5.0
"""During the grace the signal goes to the ranks again this often: a rank may have missed it (its launcher had not
started it yet, or it was blocked in a call that never returned to Python); ranks take a repeat as the same request."""
SAME_CTRL_C_S = 1.5
"""A SIGINT this soon after the first is the same Ctrl-C, not a second one: one key press can reach us more than once
(a terminal's Ctrl-C goes to the whole process group, and a wrapper in that group, an IDE's or a notebook's runner,
a script's `trap`, may forward it again). A person pressing again takes longer."""
POLL_S = 0.1
PR_SET_PDEATHSIG = 1
"""linux/prctl.h"""
SIGKILL_CODES = (-signal.SIGKILL, 128 + signal.SIGKILL, 256 - signal.SIGKILL)
"""How a process killed by SIGKILL (the kernel's OOM killer sends it) reaches us: as our child (-9), through a
shell (137), or through the deepspeed launcher, which exits with its rank's -9 (sys.exit(-9): 247)."""


def exit_code_for(signum: int | None, stall_report: str | None, timed_out: bool, first_failure: int) -> int:
    """The launch's exit code: what the user did comes first (128 + the signal's number, as a shell reports a
    process ended by it, whatever the launchers returned meanwhile), then the watchdog's stall, then the timeout,
    then the first failing process's code (0: every process succeeded)."""
    if signum is not None:
        return 128 + signum
    if stall_report:
        return EXIT_STALLED
    return EXIT_TIMED_OUT if timed_out else first_failure


@dataclass(frozen=True)
class Outcome:
    codes: list[int]
    """Each process's exit code, in the launch's order (negative: ended by that signal)."""
    exit_code: int
    """See exit_code_for: 130/143 after SIGINT/SIGTERM, EXIT_STALLED, EXIT_TIMED_OUT, the first failure's code, 0."""
    timed_out: bool = False
    stall_report: str | None = None
    signal: int | None = None
    """The first SIGINT or SIGTERM the supervisor received (and forwarded) while the launch ran."""
    killed: str | None = None
    """The line said when the first failure was a rank killed by SIGKILL (probably for memory), else None."""

    def reraise(self) -> None:
        """Deliver the signal the supervisor took to the caller's own handler, as if it had not been taken
        (SIGINT: KeyboardInterrupt; SIGTERM: usually the end of the process): a driver of several launches stops."""
        if self.signal is not None:
            signal.raise_signal(self.signal)


@dataclass(frozen=True)
class Output:
    """Where the processes' output goes: inherited (default), one file per process, or line by line to
    `on_line(process index, line)` (piped; read by one thread per process). With `on_err` too, standard error is
    piped apart, line by line to it; without, it joins standard output."""

    files: Sequence[TextIO] = ()
    on_line: Callable[[int, str], None] | None = None
    on_err: Callable[[int, str], None] | None = None


def supervise(launch: Launch, *, env: dict[str, str] | None = None, timeout: float | None = None,
              output: Output | None = None, own_groups: bool = True, stall_dir: Path | None = None,
              name: str = "zero-kit", grace: float = GRACE_S, memory_note: str | None = None) -> Outcome:  # fmt: skip
    """Run `launch` to its end. `env`: the processes' whole environment (default os.environ), launch.env added.
    own_groups: each process in a session of its own (False: in ours, so that whoever kills our process group,
    a scheduler or an OOM killer, kills the ranks with us). stall_dir: the job's heartbeat directory; when the
    watchdog ended the job there, its report is printed as `NAME: the stall watchdog ended the job: ...`.
    grace: seconds the ranks have after a forwarded signal before everything is killed. A rank killed by SIGKILL
    (not by us) is said in one line with its last sampled RSS and `memory_note` (the plan and its fix)."""
    launch.write_files()
    full_env = {**(os.environ if env is None else env), **launch.env}
    started = time.time()
    run = _Run(launch.module, own_groups, grace)
    with run.signals_forwarded():
        try:
            run.start(launch.argvs, full_env, output or Output())
            run.wait(timeout)
        finally:
            run.kill_all()
            run.join_readers()
    codes = [proc.returncode for proc in run.procs]
    report = read_marker(stall_dir, started) if stall_dir is not None and any(codes) else None
    if report is not None:
        warn(f"{name}: the stall watchdog ended the job: {report}")
    exit_code = exit_code_for(run.signal, report, run.timed_out, run.first_failure())
    killed = None if run.signal or report or run.timed_out else run.killed_line(name, memory_note)
    if killed is not None:
        warn(killed)
    return Outcome(codes, exit_code, run.timed_out, report, run.signal, killed)


class _Run:
    def __init__(self, module: str, own_groups: bool, grace: float = GRACE_S) -> None:
        self.module = module
        self.own_groups = own_groups
        self.grace = grace
        self.stop_by: float | None = None
        """When the grace after the first forwarded signal ends (time.monotonic)."""
        self.sent_at = 0.0
        self.procs: list[subprocess.Popen] = []
        self.readers: list[threading.Thread] = []
        self.failed_order: list[int] = []
        self.timed_out = False
        self.first_interrupt: float | None = None
        """When the first SIGINT came (time.monotonic)."""
        self.signal: int | None = None
        self.known: dict[int, object] = {}
        """Every descendant seen so far (psutil.Process): a rank orphaned by its launcher's death is still ours."""
        self.rss: dict[int, tuple[str, int]] = {}
        """pid -> (its RANK, its last resident set size) of every rank seen: what a rank killed for memory held."""
        self.ranks: dict[int, object] = {}
        self.gone: list[int] = []
        """Sampled ranks in the order they were seen ended (polled every turn): a launcher ends the others only
        after it noticed the first, so the first here is the one that died."""

    def start(self, argvs: list[list[str]], env: dict[str, str], output: Output) -> None:
        for index, argv in enumerate(argvs):
            sink = output.files[index] if output.files else subprocess.PIPE if output.on_line else None
            apart = sink is subprocess.PIPE and output.on_err is not None
            errors = subprocess.PIPE if apart else subprocess.STDOUT if sink is not None else None
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=errors, text=True,
                                    start_new_session=self.own_groups,
                                    preexec_fn=_launcher_setup(shield=not self.own_groups))  # fmt: skip
            self.procs.append(proc)
            pumps = [(proc.stdout, output.on_line)] if output.on_line else []
            pumps += [(proc.stderr, output.on_err)] if apart else []
            for stream, on_line in pumps:
                reader = threading.Thread(target=_pump, args=(stream, index, on_line), daemon=True)
                reader.start()
                self.readers.append(reader)

    def wait(self, timeout: float | None) -> None:
        """Until every process ended, one failed (the others are then killed: a rank that lost its peers would
        wait for them until its collective timeout), `timeout` seconds passed, or the grace after a signal ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for turn in itertools.count():
            if turn % 5 == 0:
                self.known.update((p.pid, p) for p in _descendants(self.procs))
                self.sample_rss()
            self.gone += [pid for pid, rank in self.ranks.items() if pid not in self.gone and not _running(rank)]
            for index, proc in enumerate(self.procs):
                if proc.poll() not in (None, 0) and index not in self.failed_order:
                    self.failed_order.append(index)
            if self.failed_order or all(proc.returncode is not None for proc in self.procs):
                return
            if deadline is not None and time.monotonic() > deadline:
                self.timed_out = True
                return
            if self.stop_by is not None and time.monotonic() > self.stop_by:
                return  # the ranks had their chance to save: supervise kills what is left
            if self.stop_by is not None and time.monotonic() - self.sent_at > RESEND_S:
                self.signal_ranks(self.signal)
            time.sleep(POLL_S)

    def first_failure(self) -> int:
        for index, proc in enumerate(self.procs):
            if proc.returncode and index not in self.failed_order:
                self.failed_order.append(index)  # killed after the first failure: its code comes after
        return self.procs[self.failed_order[0]].returncode if self.failed_order else 0

    def sample_rss(self) -> None:
        """Each rank's resident memory now (every half second): the OOM killer leaves no word of its own."""
        own = [p for p in (_process(proc.pid) for proc in self.procs if proc.poll() is None) if p is not None]
        for process in [*own, *self.known.values()]:
            if not _runs_module(process, self.module):
                continue
            with contextlib.suppress(Exception):  # psutil.Error: it ended meanwhile
                label = self.rss[process.pid][0] if process.pid in self.rss else _rank_of(process)
                self.rss[process.pid] = (label, process.memory_info().rss)
                self.ranks.setdefault(process.pid, process)

    def killed_line(self, name: str, memory_note: str | None) -> str | None:
        """When the first failure was a SIGKILL nobody here sent: which rank, probably for memory. Our own child
        when it was a rank; else (a launcher reported its rank's -9) the rank seen ended first, or the one that
        held the most, which is the one the kernel's OOM killer picks."""
        if not self.failed_order or self.procs[self.failed_order[0]].returncode not in SIGKILL_CODES:
            return None
        first = self.procs[self.failed_order[0]].pid
        if first not in self.rss and self.gone:
            first = self.gone[0]
        label, rss = self.rss.get(first) or max(self.rss.values(), key=lambda seen: seen[1], default=("?", None))
        held = f"last RSS {rss / GIB:.2f} GiB" if rss is not None else "no RSS sampled"
        plan = memory_note or "no memory plan for this launch"
        return f"{name}: rank {label} was killed (SIGKILL), probably for memory: {held}, {plan}"

    def signals_forwarded(self):
        return _SignalsForwarded(self)

    def forward(self, signum: int) -> None:
        """The first signal goes to every rank (they finish their step, save and exit) and starts the grace; a
        second SIGINT kills everything at once, one within SAME_CTRL_C_S of the first is that one again. Ranks
        take a repeated signal as the same request."""
        now = time.monotonic()
        self.signal = self.signal or signum
        if self.stop_by is None:
            self.stop_by = now + self.grace
        if signum == signal.SIGINT:
            if self.first_interrupt is not None and now - self.first_interrupt <= SAME_CTRL_C_S:
                return  # the same Ctrl-C, delivered again
            if self.first_interrupt is not None:
                warn("zero-kit: a second Ctrl-C: stopping every process at once")
                self.kill_all()
                return
            self.first_interrupt = now
        if self.signal_ranks(signum):
            return
        # No rank of ours to ask: a launcher that started its ranks elsewhere, or one that has not started them
        # yet. Launchers in our group block SIGINT (see the module's docstring): SIGTERM asks them the same.
        launcher_signal = signum if self.own_groups else signal.SIGTERM
        for proc in self.procs:
            if proc.poll() is None:
                _signal(_process(proc.pid), launcher_signal)

    def signal_ranks(self, signum: int) -> bool:
        """Send `signum` to every rank of ours (processes running the launch's module); False when there is none."""
        self.sent_at = time.monotonic()
        found = _descendants(self.procs)
        self.known.update((p.pid, p) for p in found)
        ours = [_process(proc.pid) for proc in self.procs if proc.poll() is None]  # a launch may start ranks itself
        ranks = [p for p in [*ours, *found] if p is not None and _runs_module(p, self.module)]
        for rank in ranks:
            # A rank that still blocks SIGINT (inherited from a launcher started with it blocked, until the rank
            # installs its own handler) is starting up, with nothing to save yet: SIGTERM ends it.
            _signal(rank, signal.SIGTERM if signum == signal.SIGINT and _deaf_to_sigint(rank.pid) else signum)
        return bool(ranks)

    def kill_all(self) -> None:
        """SIGKILL every process still running and every descendant (torchrun puts each rank into a session of
        its own, so a launcher's process group does not hold its ranks)."""
        self.known.update((p.pid, p) for p in _descendants(self.procs))
        left = [p for p in self.known.values() if _running(p)]
        ours = os.getpgrp()
        groups = {_pgid(p.pid) for p in left} - {ours, None}
        for proc in self.procs:
            if proc.poll() is None and self.own_groups:
                groups.add(proc.pid)
        for group in groups:
            _quietly(os.killpg, group, signal.SIGKILL)
        for proc in left:
            _quietly(proc.kill)
        for proc in self.procs:
            if proc.poll() is None:
                _quietly(proc.kill)
            proc.wait()
        deadline = time.monotonic() + 10  # SIGKILL lands asynchronously; return only once they are gone
        while any(_running(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.01)

    def join_readers(self) -> None:
        for reader in self.readers:
            reader.join(10)


class _SignalsForwarded:
    """SIGINT and SIGTERM handlers that forward to the ranks while the launch runs (main thread only: Python
    delivers signals there; elsewhere the launch runs without them)."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.previous: dict[int, object] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, lambda s, frame: self.run.forward(s))

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _launcher_setup(shield: bool) -> Callable[[], None]:
    """What a launcher runs between fork and exec (see the module's docstring): SIGINT blocked when `shield` (a
    launcher in our process group), and SIGTERM when the thread that starts it dies. Everything it calls is
    resolved here, before the fork."""
    parent = os.getpid()
    set_death_signal = _death_signal_setter()
    block = signal.pthread_sigmask

    def setup() -> None:
        if shield:
            block(signal.SIG_BLOCK, {signal.SIGINT})
        if set_death_signal is not None:
            set_death_signal(signal.SIGTERM)
            if os.getppid() != parent:  # we died between the fork and the prctl: no signal will come
                os._exit(128 + signal.SIGTERM)

    return setup


@functools.cache
def _death_signal_setter() -> Callable[[int], object] | None:
    """prctl(PR_SET_PDEATHSIG, signum) of the C library (Linux); None elsewhere. The signal comes when the *thread*
    that forked the process ends, not the process: supervise starts a launch and waits for it in one thread."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return lambda signum: prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)


def _deaf_to_sigint(pid: int) -> bool:
    """Whether the process blocks or ignores SIGINT (Linux: the SigBlk and SigIgn masks of /proc/PID/status, the
    former its main thread's; elsewhere: assume not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return False
    bit = 1 << (signal.SIGINT - 1)
    masks = [line.split()[1] for line in status.splitlines() if line.startswith(("SigBlk:", "SigIgn:"))]
    return any(int(mask, 16) & bit for mask in masks)


def _pump(stream: TextIO, index: int, on_line: Callable[[int, str], None]) -> None:
    for line in stream:
        on_line(index, line.replace("\r", ""))  # ssh -tt output ends lines with \r\n


def _process(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _descendants(procs: list[subprocess.Popen]) -> list:
    import psutil

    found = []
    for proc in procs:
        parent = _process(proc.pid)
        if parent is not None:
            with contextlib.suppress(psutil.Error):
                found += parent.children(recursive=True)
    return found


def _runs_module(process, module: str) -> bool:
    """A rank: `python [-u] -m MODULE ...` (a launcher's own `-m` names the launcher, never the module)."""
    try:
        cmdline = process.cmdline()
    except Exception:  # psutil.Error: gone, or not ours to read
        return False
    return "-m" in cmdline[:4] and cmdline.index("-m") + 1 < len(cmdline) and cmdline[cmdline.index("-m") + 1] == module


def _rank_of(process) -> str:
    """The rank's RANK (its launcher's environment, readable for our own processes), else its pid."""
    try:
        return process.environ().get("RANK") or f"(pid {process.pid})"
    except Exception:  # psutil.Error
        return f"(pid {process.pid})"


def _signal(process, signum: int) -> None:
    if process is not None:
        _quietly(process.send_signal, signum)


def _running(process) -> bool:
    try:
        return process.is_running() and process.status() != "zombie"
    except Exception:  # psutil.Error
        return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _quietly(call, *args) -> None:
    with contextlib.suppress(Exception):  # ProcessLookupError, psutil.NoSuchProcess: it ended meanwhile
        call(*args)

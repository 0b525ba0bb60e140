"""One job per output directory (issue 39): a run claims its --output before it reads a checkpoint to resume,
deletes or writes anything there, and a second run on the same output is refused in its first seconds.

Two jobs on one output interleave their `train_log.jsonl`, both write `checkpoint-N` and both export to `final/`;
nothing in the directory would say so. An output needs the care of a build directory, so the claim is the op
builds' owner record (zero_kit.launch.ops): a small file, OUTPUT/.zero_kit_claim, flocked by its holder for the
run's life and naming it (host, pid and that process's start time, Slurm job id and restart count, since when).

- Who holds it: the process that starts the job. `zero-kit train --nproc/--hostfile` holds it in the relaunching
  parent and hands it to its ranks (the plan's claim_token: rank 0 checks the claim still names its parent before it deletes
  anything); under an outside launcher (torchrun, deepspeed, srun) the process of RANK 0 holds it.
- Alive or dead: a holder on this host is alive while its pid runs with the recorded start time (pids are reused);
  this host is the same hostname and the same boot (the kernel's boot id: two machines sharing a hostname, or this
  one rebooted, are other hosts);
  a holder elsewhere is alive while its heartbeat (the file's mtime, touched every HEARTBEAT_S) is younger than
  STALE_S, since flock on a shared filesystem may be local to each host. An flock held is alive whatever the record
  says: the kernel drops it when its holder dies, also after kill -9. A dead holder's claim is taken over, said in
  one line.
- A job Slurm requeued (same job id, a higher restart count) waits for its own earlier run to let go, up to
  REQUEUE_WAIT_S, saying so; it never writes beside it. Still held after that: exit 75, try again later.
- It goes at the end of the run, whatever the end (a kill -9 leaves a file whose holder is dead).
- Ranks outlive no parent, and no claim is taken over beside them. A relaunching parent names itself to its ranks
  (PARENT_ENV); each rank on its host (`bind_rank`) holds a shared flock on OUTPUT/.zero_kit_claim.ranks for its
  life and leaves, within POLL_S, when that parent is gone (kill -9, the OOM killer: nobody is left to supervise the
  job or to hold its claim). `take` never takes over the claim of a dead holder while that file's flock is held: it
  waits up to RANKS_WAIT_S for the old job's ranks to stop, then refuses. One flock, held by the ranks themselves, is
  the simplest sound record: the kernel drops it when the last of them dies (also by SIGKILL), with no pid list to
  keep true or to mistake for a reused pid. The holder removes the file when it lets go and no rank holds it. Ranks
  on other hosts do not bind: a dead peer there fails the job's next collective.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from zero_kit.errors import EXIT_PREEMPTED, UserError
from zero_kit.launch.ops import clock, flock_within, owner_record
from zero_kit.log import RUN_LOG, warn

CLAIM = ".zero_kit_claim"
"""The claim's token (host:pid:start) a relaunching parent gives its ranks: rank 0 checks it is still the holder."""
HEARTBEAT_S = 5.0
"""How often a holder touches its claim (the heartbeat another host reads)."""
STALE_S = 120.0
"""A claim from another host whose heartbeat is older than this is dead: 24 missed beats, and more than the 60 s an
NFS client may cache a file's attributes (acregmax)."""
REQUEUE_WAIT_S = 600.0
"""How long a requeued job waits for its own earlier run to let go (Slurm kills it first; a node that died stops
beating and is dead after STALE_S)."""
POLL_S = 1.0
RANKS = ".zero_kit_claim.ranks"
"""Beside the claim: every rank a relaunching parent started on its host holds a shared flock on it (bind_rank)."""
RANKS_WAIT_S = 60.0
"""How long `take` waits for the ranks of a dead holder to stop: within POLL_S while they train, after their imports
while they start."""
PARENT_ENV = "ZERO_KIT_PARENT"
"""The relaunching parent as a holder record (JSON), set for its ranks (`parent_env`, read by `bind_rank`)."""
_rank_locks: list[int] = []  # bind_rank's open flocked files: held for the process's life


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a claim: the record in the file, and the file's mtime as its last heartbeat."""

    host: str
    pid: int
    pid_started: float | None  # the process's start time (psutil): a reused pid is another process
    job_id: str | None
    restart: int
    started: float
    beat: float = 0.0
    boot_id: str | None = None
    """The kernel's boot id (None: unreadable, or a record written before it was kept): a hostname two machines
    share is not one host."""

    @property
    def token(self) -> str:
        return f"{self.host}:{self.pid}:{self.pid_started}"

    def describe(self, now: float) -> str:
        if not self.pid:
            return f"a process that has not written its record yet, since {clock(self.started)}"
        job = f", Slurm job {self.job_id}" + (f" restart {self.restart}" if self.restart else "") if self.job_id else ""
        beat = max(0.0, now - self.beat)
        return f"pid {self.pid} on {self.host}{job}, since {clock(self.started)}, last heartbeat {beat:.0f} s ago"

    def how_to_stop(self) -> str:
        if not self.pid:
            return "the process that holds the file open (`fuser -v FILE`)"
        by_job = f" or `scancel {self.job_id}`" if self.job_id else ""
        return f"`kill {self.pid}` on {self.host}{by_job}"


def me(environ: dict[str, str]) -> Holder:
    """This process as a holder: the Slurm job and its restart count from the environment."""
    import psutil

    record = owner_record()
    restart = environ.get("SLURM_RESTART_COUNT", "")
    return Holder(
        host=record["host"],
        pid=record["pid"],
        pid_started=psutil.Process().create_time(),
        job_id=environ.get("SLURM_JOB_ID") or None,
        restart=int(restart) if restart.isdigit() else 0,
        started=record["started"],
        boot_id=boot_id(),
    )


def boot_id() -> str | None:
    """This boot of this machine's kernel (Linux), or None where there is no such file."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def read(path: Path) -> Holder | None:
    """The holder a claim file names, its heartbeat from the mtime; None when absent, empty or being written."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        fields = {key: record[key] for key in ("host", "pid", "pid_started", "job_id", "restart", "started")}
        return Holder(**fields, beat=path.stat().st_mtime, boot_id=record.get("boot_id"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_alive(holder: Holder, now: float, host: str | None = None, boot: str | None = None) -> bool:
    """On this host: its pid runs (not a zombie) with the recorded start time. Elsewhere: its heartbeat is younger
    than STALE_S. This host: see `on_this_host`."""
    if not on_this_host(holder, host, boot):
        return now - holder.beat < STALE_S
    import psutil

    try:
        process = psutil.Process(holder.pid)
        started = process.create_time()
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its own parent
            return False
    except psutil.Error:
        return False
    return holder.pid_started is None or abs(started - holder.pid_started) < 1.0


def on_this_host(holder: Holder, host: str | None = None, boot: str | None = None) -> bool:
    """The holder's host is this one: `host` (default: this hostname) and, where both records have one, the same boot
    id (`boot`, default: this kernel's)."""
    boot = boot or boot_id()
    other_boot = holder.boot_id is not None and boot is not None and holder.boot_id != boot
    return holder.host == (host or socket.gethostname()) and not other_boot


def earlier_self(holder: Holder, mine: Holder) -> bool:
    """The holder is an earlier run of this Slurm job (requeued since): wait for it, never refuse for it."""
    return mine.job_id is not None and holder.job_id == mine.job_id and holder.restart < mine.restart


class Claim:
    """A claim held: the open, flocked file (None: nothing held, e.g. a rank that is not the holder) and the
    heartbeat thread. `release` ends both and removes the file if it is still ours."""

    def __init__(self, path: Path | None = None, fd: int | None = None, holder: Holder | None = None,
                 created: tuple[Path, ...] = ()):  # fmt: skip
        self.path, self.fd, self.holder = path, fd, holder
        self.created = created  # directories the claim made, deepest first: a run that did nothing leaves none
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if fd is not None:
            self._thread = threading.Thread(target=self._beat, name="zero-kit claim", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):  # a filesystem gone away: the run itself will say so
                os.utime(self.fd)

    def release(self) -> None:
        if self.fd is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            same = os.fstat(self.fd).st_ino == self.path.stat().st_ino
            if same and (held := read(self.path)) is not None and held.token == self.holder.token:
                _remove_if_unheld(self.path.parent / RANKS)  # while the claim is held: no new ranks can come
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self.fd)  # drops the flock
            self.fd = None
        for directory in self.created:
            try:
                directory.rmdir()  # only while empty: a run's work stays
            except OSError:
                break


def hold_claim(output: Path, environ: dict[str, str], wait_s: float = REQUEUE_WAIT_S) -> Claim:
    """This process's part in the claim on `output`, in a process that starts the job: take it (alone, a relaunching
    parent, or RANK 0 of an outside launcher) or nothing (the other ranks of an outside launcher). A relaunch's ranks
    never get here: the plan hands them the token, which rank 0 checks (`check_handed`). Raises UserError when
    another run holds it."""
    if environ.get("RANK", "0") != "0":
        return Claim()  # the claim is RANK 0's under an outside launcher
    return take(output, me(environ), wait_s)


def take(output: Path, mine: Holder, wait_s: float = REQUEUE_WAIT_S, ranks_wait_s: float = RANKS_WAIT_S) -> Claim:
    """The claim on `output` for `mine`, or a UserError naming the live holder and the ways on. A requeued job's
    earlier run is waited for, up to `wait_s`; the ranks of a dead holder still running here, up to `ranks_wait_s`."""
    waited_since = ranks_since = None
    while True:
        claim, holder, ranks_left = _try_take(output, mine)
        if claim is not None:
            return claim
        now = time.time()
        if ranks_left:
            ranks_since = _wait_for_ranks(output, holder, ranks_since, ranks_wait_s, now)
        elif not earlier_self(holder, mine):
            raise refusal(output, holder, now)
        elif waited_since is None:
            waited_since = now
            warn(f"zero-kit train: requeued job {mine.job_id} (restart {mine.restart}): waiting up to {wait_s:.0f} s for its earlier "
                 f"run to let go of {output} ({holder.describe(now)})")  # fmt: skip
        elif now - waited_since >= wait_s:
            raise UserError(
                f"--output {output}: the earlier run of this requeued job still holds it after {wait_s:.0f} s "
                f"({holder.describe(now)}); nothing was written. Requeue again later, or stop it with "
                f"{holder.how_to_stop()}",
                exit_code=EXIT_PREEMPTED,
            )
        time.sleep(POLL_S)


def _wait_for_ranks(output: Path, holder: Holder | None, since: float | None, wait_s: float, now: float) -> float:
    """One turn of waiting for the ranks of a run that is gone: said once, refused (exit 75: try again later) after
    `wait_s`. Returns when the wait started."""
    who = f"a run that is gone ({holder.describe(now)})" if holder is not None else "a run that is gone"
    if since is None:
        warn(f"zero-kit train: {output}: the ranks of {who} still run on this host; waiting up to {wait_s:.0f} s for "
             "them to stop")  # fmt: skip
        return now
    if now - since >= wait_s:
        raise UserError(
            f"--output {output}: the ranks of {who} still run on this host after {wait_s:.0f} s; nothing was changed. "
            f"Wait for them to end, pass another --output, or find them with `fuser -v {output / RANKS}`",
            exit_code=EXIT_PREEMPTED,
        )
    return since


def refusal(output: Path, holder: Holder, now: float) -> UserError:
    """The one line of a refused run: the output, the running job and the ways on."""
    return UserError(
        f"--output {output} is in use by another run ({holder.describe(now)}); nothing was changed. Wait for it to "
        f"end, pass another --output, or stop it with {holder.how_to_stop()}"
    )


def _try_take(output: Path, mine: Holder) -> tuple[Claim | None, Holder | None, bool]:
    """(the claim, None, False) when taken; (None, the live holder, False), or (None, the dead holder if any, True)
    while ranks of a run still hold RANKS on this host."""
    path = output / CLAIM
    created = tuple(directory for directory in (output, *output.absolute().parents) if not directory.exists())
    output.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = flock_within(fd, 0)
        except OSError:  # no flock on this filesystem: the record alone decides
            locked = None
        if locked is False:
            os.close(fd)
            return None, _read_settled(path) or _unknown(path), False
        if _same_file(fd, path):
            break
        os.close(fd)  # released meanwhile: its holder removed the file we flocked; take the new one
    holder = read(path)
    if holder is not None and is_alive(holder, time.time(), mine.host, mine.boot_id):
        os.close(fd)
        return None, holder, False
    if _is_held(output / RANKS):  # its holder died, its ranks still write here
        os.close(fd)
        return None, holder, True
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({key: value for key, value in asdict(mine).items() if key != "beat"}).encode(), 0)
    os.fsync(fd)
    if holder is not None:
        warn(f"zero-kit train: took over {output} from a run that is gone ({holder.describe(time.time())})")
    return Claim(path, fd, mine, created), None, False


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


def _read_settled(path: Path) -> Holder | None:
    """A live holder's record; a holder that took the flock this instant may not have written it yet."""
    for _ in range(10):
        holder = read(path)
        if holder is not None:
            return holder
        time.sleep(0.1)
    return None


def _unknown(path: Path) -> Holder:
    """A holder whose flock is held but whose record is still empty (pid 0: said as such)."""
    try:
        beat = path.stat().st_mtime
    except OSError:
        beat = time.time()
    return Holder(host="?", pid=0, pid_started=None, job_id=None, restart=0, started=beat, beat=beat)


def check_handed(output: Path, token: str) -> None:
    """Rank 0 of a relaunch, before it deletes or writes anything: the claim still names the parent that started
    it (a run that took over a claim it thought dead would otherwise write beside this one)."""
    holder = read(output / CLAIM)
    if holder is None or holder.token != token:
        now = time.time()
        who = holder.describe(now) if holder is not None else "nobody"
        raise UserError(
            f"--output {output}: the claim this run's launcher took is gone (now held by {who}); nothing was "
            "deleted. Wait for the other run to end, or pass another --output"
        )


def is_running(output: Path) -> Holder | None:
    """The live run that holds `output`, for readers (`zero-kit export`); None when no run holds it."""
    holder = read(output / CLAIM)
    return holder if holder is not None and is_alive(holder, time.time()) else None


def parent_env() -> dict[str, str]:
    """What a relaunching parent (this process) gives its ranks: itself as a holder record, for `bind_rank`."""
    record = {key: value for key, value in asdict(me(dict(os.environ))).items() if key != "beat"}
    return {PARENT_ENV: json.dumps(record)}


def bind_rank(output: Path, environ: Mapping[str, str]) -> bool:
    """A rank of a relaunch, on its parent's host (PARENT_ENV names the parent): hold a shared flock on OUTPUT/RANKS
    for this process's life (`take` does not take the claim over while it is held), and leave at once when the
    parent is gone, now or later (a thread looks every POLL_S). False where there is nothing to bind: no
    relaunching parent (ranks of an outside launcher), or one on another host."""
    try:
        parent = Holder(**json.loads(environ[PARENT_ENV]))
    except (KeyError, ValueError, TypeError):
        return False
    if not on_this_host(parent):
        return False
    with contextlib.suppress(OSError):  # no flock on this filesystem: the watch alone
        fd = os.open(output / RANKS, os.O_RDWR | os.O_CREAT, 0o644)
        _rank_locks.append(fd)
        _flock_shared(fd)
    rank = environ.get("RANK", "?")
    if not is_alive(parent, time.time()):
        _leave(parent, rank, output)
    threading.Thread(target=_watch, args=(parent, rank, output), name="zero-kit parent watch", daemon=True).start()
    return True


def _watch(parent: Holder, rank: str, output: Path) -> None:
    while is_alive(parent, time.time()):
        time.sleep(POLL_S)
    _leave(parent, rank, output)


def _leave(parent: Holder, rank: str, output: Path) -> None:
    """Exit at once (1: the launcher then ends the other ranks; nobody is left to read it), saying why: on stderr,
    and in the run's log (OUTPUT/zero_kit.log), since the parent relayed this rank's output to the terminal."""
    line = f"zero-kit train: rank {rank} stops: the process that started the job (pid {parent.pid} on {parent.host}) is gone"
    with contextlib.suppress(Exception):  # a reentrant write from this thread, a closed pipe: leave all the same
        with open(output / RUN_LOG, "a", encoding="utf-8") as log:
            log.write(line + "\n")
        warn(line)
        sys.stderr.flush()
    os._exit(1)


def _flock_shared(fd: int, seconds: float = 10.0) -> None:
    """The shared flock on `fd`; an exclusive one (a `take` or a `release` looking) is held for an instant only."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _is_held(path: Path) -> bool:
    """Whether a process holds a flock on `path` (the ranks of a run, on this host)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:  # no flock on this filesystem: nothing to tell
        return False
    finally:
        os.close(fd)  # drops the flock if it was ours


def _remove_if_unheld(path: Path) -> None:
    """Remove `path` unless a rank holds it (then a later `take` still finds them)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink()
    except OSError:  # held (BlockingIOError), gone meanwhile, or no flock here
        pass
    finally:
        os.close(fd)

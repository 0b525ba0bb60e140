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
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from zero_kit.errors import EXIT_PREEMPTED, UserError
from zero_kit.launch.ops import clock, flock_within, owner_record
from zero_kit.log import warn

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
    """On this host: its pid runs with the recorded start time. Elsewhere: its heartbeat is younger than STALE_S.
    This host: `host` (default: this hostname) and, where both records have one, the same boot id (`boot`,
    default: this kernel's)."""
    boot = boot or boot_id()
    other_boot = holder.boot_id is not None and boot is not None and holder.boot_id != boot
    if holder.host != (host or socket.gethostname()) or other_boot:
        return now - holder.beat < STALE_S
    import psutil

    try:
        started = psutil.Process(holder.pid).create_time()
    except psutil.Error:
        return False
    return holder.pid_started is None or abs(started - holder.pid_started) < 1.0


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


def take(output: Path, mine: Holder, wait_s: float = REQUEUE_WAIT_S) -> Claim:
    """The claim on `output` for `mine`, or a UserError naming the live holder and the ways on. A requeued job's
    earlier run is waited for, up to `wait_s`."""
    waited_since = None
    while True:
        claim, holder = _try_take(output, mine)
        if claim is not None:
            return claim
        now = time.time()
        if not earlier_self(holder, mine):
            raise refusal(output, holder, now)
        if waited_since is None:
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


def refusal(output: Path, holder: Holder, now: float) -> UserError:
    """The one line of a refused run: the output, the running job and the ways on."""
    return UserError(
        f"--output {output} is in use by another run ({holder.describe(now)}); nothing was changed. Wait for it to "
        f"end, pass another --output, or stop it with {holder.how_to_stop()}"
    )


def _try_take(output: Path, mine: Holder) -> tuple[Claim | None, Holder | None]:
    """(the claim, None) when taken; (None, the live holder) otherwise."""
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
            return None, _read_settled(path) or _unknown(path)
        if _same_file(fd, path):
            break
        os.close(fd)  # released meanwhile: its holder removed the file we flocked; take the new one
    holder = read(path)
    if holder is not None and is_alive(holder, time.time(), mine.host, mine.boot_id):
        os.close(fd)
        return None, holder
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({key: value for key, value in asdict(mine).items() if key != "beat"}).encode(), 0)
    os.fsync(fd)
    if holder is not None:
        warn(f"zero-kit train: took over {output} from a run that is gone ({holder.describe(time.time())})")
    return Claim(path, fd, mine, created), None


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

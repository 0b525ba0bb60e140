"""What every rig shares: the Debian packages it needs, root and binary checks, bounded commands and waits,
daemons started inside a namespace (own UTS hostname) and stopped by PID file, and the private
TORCH_EXTENSIONS_DIR that ranks on the rigs use.

Rig errors are `RigError` values whose message names the fix; the CLI prints them without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

# binary -> Debian package that provides it (Debian 12: Slurm 22.05, OpenSSH 9.2, pdsh 2.34)
BINARY_PACKAGES = {
    "ip": "iproute2",
    "tc": "iproute2",
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "sshd": "openssh-server",
    "ssh-keygen": "openssh-client",
    "pdsh": "pdsh",
}
APT_PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge", "openssh-server", "pdsh", "iproute2")
ETC_NETNS = Path("/etc/netns")
# Where ranks on the rigs build DeepSpeed's CPU ops. WHY private: the default ~/.cache/torch_extensions is shared
# with every other virtual environment on the machine, and a build from another torch/deepspeed wipes it, so a
# 15 s run became a 75-105 s run (60-100 s JIT build of deepspeed_shm_comm) at random.


def private_extensions_dir() -> Path:
    """DeepSpeed JIT-builds its CPU ops into TORCH_EXTENSIONS_DIR (~/.cache/torch_extensions by default). Shared
    with other environments (other torch/DeepSpeed versions, or another venv), the builds overwrite each other and
    every run rebuilds (60-240 s on 2 cores). zero_kit's own choice (zero_kit.launch.ops.extensions_dir: one
    directory per version pair and venv, the one `zero-kit train` and `bench` use) keeps them cached; the tests
    (tests/conftest.py) and every rank on every rig use it (pdsh ranks through .deepspeed_env, Slurm jobs from
    the submitter's environment). An explicit TORCH_EXTENSIONS_DIR wins."""
    from zero_kit.launch.ops import extensions_dir

    return extensions_dir()


T = TypeVar("T")
_children: dict[int, subprocess.Popen] = {}  # daemons this process started: reaped on stop, so none stays a zombie


class RigError(RuntimeError):
    """A rig could not be built or used; the message says why and what to do."""


def apt_packages() -> tuple[str, ...]:
    return APT_PACKAGES


def apt_line() -> str:
    return f"apt-get update && apt-get install -y {' '.join(APT_PACKAGES)}"


def require(*binaries: str) -> None:
    """Root and every binary present, or a RigError naming what is missing and the apt-get line."""
    if os.geteuid() != 0:
        raise RigError("the rigs need root (network namespaces, daemons, /etc/netns)")
    missing = [name for name in binaries if _which(name) is None]
    if missing:
        packages = sorted({BINARY_PACKAGES.get(name, name) for name in missing})
        raise RigError(
            f"missing {', '.join(missing)} (Debian packages {', '.join(packages)}); install with: {apt_line()}"
        )


def _which(name: str) -> str | None:
    # daemons live in /usr/sbin, which a non-login PATH may lack
    for folder in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/sbin"]:
        candidate = Path(folder, name)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def check_prefix(prefix: str) -> str:
    # interface names are PREFIX0v / PREFIX1v and Linux allows 15 characters
    if not re.fullmatch(r"[a-z][a-z0-9]{0,12}", prefix):
        raise RigError(f"prefix {prefix!r}: use 1-13 lowercase letters/digits, starting with a letter")
    return prefix


def run(argv: Sequence[str], timeout: float = 30, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """A command with a timeout; on failure a RigError carrying its stderr."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise RigError(f"timed out after {timeout} s: {' '.join(argv)}") from exc
    if check and done.returncode != 0:
        raise RigError(f"exit {done.returncode}: {' '.join(argv)}\n{done.stderr.strip()}")
    return done


def wait_until(
    ready: Callable[[], T], timeout: float, what: str, interval: float = 0.2, gone: Callable[[], str] | None = None
) -> T:
    """Poll `ready()` until it returns something truthy, and return that. RigError when `timeout` seconds pass, or
    as soon as `gone()` names why it can no longer happen (the process that would make it ready has ended).
    The one wait of the rigs and of every test tier (tests/support re-uses it)."""
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        reason = gone() if gone is not None else ""
        if reason:
            raise RigError(f"{reason} before {what}")
        if time.monotonic() > deadline:
            raise RigError(f"{what} not ready after {timeout} s")
        time.sleep(interval)
    return value


class Hosts(Protocol):
    """The two hosts a rig runs on (netns.TwoHosts)."""

    names: tuple[str, str]
    addresses: tuple[str, str]

    def exec(self, node: int, *argv: str) -> list[str]: ...


@dataclass(frozen=True)
class OnHosts:
    """What every rig handle shares (SshHosts, SlurmCluster): its hosts, its folder, and running a command on one
    of the hosts through `command` (the host's namespace, plus whatever the rig's clients need)."""

    hosts: Hosts
    root: Path

    def command(self, argv: Sequence[str], node: int = 0) -> list[str]:
        return self.hosts.exec(node, *argv)

    def run(self, argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None,
            cwd: str | Path | None = None, node: int = 0) -> subprocess.CompletedProcess:  # fmt: skip
        """Run on `node` (default: host 0, where launchers and Slurm clients belong) and return the result whatever
        the exit code; TimeoutExpired after `timeout`. The default environment is rig_env(): the venv's bin first
        on PATH and the private TORCH_EXTENSIONS_DIR (a Slurm job inherits the submitter's: --export=ALL)."""
        return subprocess.run(self.command(argv, node), capture_output=True, text=True, timeout=timeout,
                              env=dict(env or rig_env()), cwd=cwd)  # fmt: skip


@contextlib.contextmanager
def rig_session(up: Callable[[], T], down: Callable[[], object]) -> Iterator[T]:
    """The rig `up()` builds, for the body; `down()` always runs after, also when the body fails, times out or
    is ended by SIGTERM (see sigterm_raises)."""
    with sigterm_raises():
        try:
            yield up()
        finally:
            down()


def start_daemon(namespace: str, hostname: str, argv: Sequence[str], log: Path, pid_file: Path) -> int:
    """Start `argv` in network namespace `namespace` and a fresh UTS namespace whose hostname is `hostname`.

    WHY the UTS namespace: slurmctld refuses to run unless the hostname is SlurmctldHost, slurmd takes its node
    name from it, and ranks started over ssh see their own host name (which resolves to their own address, so gloo
    binds the right interface). `ip netns exec`, `unshare` and `exec` all exec in place: the PID is the daemon's.
    """
    wrapper = ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"']
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen([*wrapper, hostname, *argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    _children[proc.pid] = proc
    pid_file.write_text(f"{proc.pid} {Path(argv[0]).name}\n", encoding="utf-8")
    return proc.pid


def is_alive(pid: int) -> bool:
    """Running and not a zombie (a killed process stays in /proc until its parent reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pid_from_file(pid_file: Path) -> int | None:
    """The PID recorded by start_daemon, only if that PID still runs the same program (PIDs get reused)."""
    try:
        pid_text, comm = pid_file.read_text(encoding="utf-8").split()
        pid = int(pid_text)
        return pid if Path(f"/proc/{pid}/comm").read_text().strip() == comm[:15] else None
    except (OSError, ValueError):
        return None


def stop_daemons(pid_files: Sequence[Path], timeout: float = 10) -> None:
    """SIGTERM in the given order, wait, then SIGKILL whatever is left."""
    pids = [pid for pid in map(_pid_from_file, pid_files) if pid is not None]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive_reaping(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if _alive_reaping(pid):
            _signal(pid, signal.SIGKILL)


def _alive_reaping(pid: int) -> bool:
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        _children.pop(pid, None)
    return is_alive(pid)


def teardown(*steps: Callable[[], object]) -> None:
    """Run every cleanup step even when an earlier one fails, then raise the first failure."""
    errors = []
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 (the remaining steps must still run)
            errors.append(exc)
    if errors:
        raise errors[0]


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def namespace_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    return [int(pid) for pid in done.stdout.split()]


def kill_namespace_processes(namespaces: Sequence[str]) -> None:
    """SIGKILL everything left in the rig's namespaces (job steps, ranks, launchers): all of it is the rig's."""
    for namespace in namespaces:
        for pid in namespace_pids(namespace):
            _signal(pid, signal.SIGKILL)
    for pid in list(_children):
        _alive_reaping(pid)  # reap our own killed daemons so they do not linger as zombies


def write_etc_hosts(namespaces: Sequence[str], addresses: Sequence[str]) -> None:
    """/etc/netns/NS/hosts naming both hosts: `ip netns exec` bind-mounts it over /etc/hosts in NS only."""
    text = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in zip(namespaces, addresses, strict=True))
    for namespace in namespaces:
        (ETC_NETNS / namespace).mkdir(parents=True, exist_ok=True)
        (ETC_NETNS / namespace / "hosts").write_text(text, encoding="utf-8")


def remove_etc_netns(namespaces: Sequence[str]) -> None:
    import shutil

    for namespace in namespaces:
        shutil.rmtree(ETC_NETNS / namespace, ignore_errors=True)
    with contextlib.suppress(OSError):
        ETC_NETNS.rmdir()  # only when no other rig still uses it


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside, SIGTERM raises SystemExit(143). WHY: a CI or `timeout` kill sends SIGTERM, which ends Python without
    running `finally`, so the rig would stay up. Only in the main thread and only over the default handler; SIGKILL
    cannot be caught (the next `up` of the same prefix clears what it left)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def rank_path() -> str:
    """PATH for every rank on every rig: the venv's bin first, then the system's. WHY the same everywhere: the venv
    has pip's ninja 1.13, Debian has ninja 1.11, and each treats the other's .ninja_log/.ninja_deps as foreign, so
    ranks with different PATHs rebuilt deepspeed_shm_comm (80-160 s) on every run, ping-pong."""
    return f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def rig_env(**extra: str) -> dict[str, str]:
    """This process's environment for commands on a rig: rank_path() as PATH (deepspeed, torchrun, ninja),
    the private TORCH_EXTENSIONS_DIR, and `extra`. Slurm jobs inherit it (sbatch/srun --export=ALL)."""
    env = dict(os.environ)
    env["PATH"] = rank_path()
    env["TORCH_EXTENSIONS_DIR"] = str(private_extensions_dir())
    env.update(extra)
    return env


def build_cpu_ops(timeout: float = 900, env: Mapping[str, str] | None = None) -> float:
    """Build DeepSpeed's shm all-reduce op into the private TORCH_EXTENSIONS_DIR once (60-100 s on 2 cores; a
    cache hit takes a few seconds), so a launcher run's timeout never pays for a compile. Returns seconds taken."""
    clear_stale_build_lock()
    start = time.monotonic()
    code = "from deepspeed.ops.op_builder import ShareMemCommBuilder as B; B().load(verbose=False)"
    run([sys.executable, "-c", code], timeout=timeout, env=dict(env or rig_env()))
    return time.monotonic() - start


def clear_stale_build_lock() -> None:
    """Remove a torch extension build `lock` that no live process can own. WHY: every rank takes that lock on load
    (even when ninja has nothing to do); a rank killed while holding it (a timeout, a rig teardown) leaves the file
    behind and every later load waits on it forever."""
    if not any(_uses_private_extensions(pid) for pid in _pids()):
        for lock in private_extensions_dir().glob("*/lock"):
            lock.unlink(missing_ok=True)


def _pids() -> list[int]:
    return [
        int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit() and int(entry.name) != os.getpid()
    ]


def _uses_private_extensions(pid: int) -> bool:
    try:
        return f"TORCH_EXTENSIONS_DIR={private_extensions_dir()}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False

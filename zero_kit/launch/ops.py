"""DeepSpeed's JIT-built ops (cpu_adam, the shm all-reduce, fused Adam on CPU): where they build, builds that
never hang on a dead lock, and builds ahead of time (`zero-kit ops build`).

- One build directory per environment and torch/DeepSpeed pair (`extensions_dir`), unless the user set
  TORCH_EXTENSIONS_DIR: the default ~/.cache/torch_extensions is shared by every venv and version on the machine,
  and each rebuilds the others' ops (60-240 s on 2 cores) on every start.
- torch builds under a `lock` file (torch.utils.file_baton.FileBaton: created with O_EXCL, no owner inside, held
  open while the build runs); a process killed mid-build leaves it and every later load waits on it forever. So
  each build here first takes an flock on an owner record beside it (the kernel drops an flock when its holder
  dies: a zero_kit build that holds it is alive, on any host whose filesystem supports flock), then looks at
  torch's lock: held open by a live process of this user on this host, it is waited for with a line saying so;
  otherwise nobody can be building (zero_kit's builders hold the flock, which is now ours) and it is removed.
  Half-built objects need no cleaning: ninja rebuilds every output its log does not record as finished.
- A first build says so and how long it takes; the stall watchdog is kept informed while a build is alive.
- The shm all-reduce op, once loaded, never removes the shared memory it creates: `init_distributed` removes its
  names as soon as every rank has mapped them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from zero_kit.log import warn

ENV = "TORCH_EXTENSIONS_DIR"
LOCK = "lock"  # torch's FileBaton in each op's build directory
OWNER = "zero_kit.owner"  # ours beside it: flocked by the build, pid/host/start inside
STALE_RECHECK_S = 1.0
"""A lock seen without a holder is looked at again after this long before it is removed: torch's FileBaton closes
its file before it removes it, and a lock in that instant is being released, not abandoned."""
QUIET_WAIT_S = 3.0
"""How long a build slot is waited for before saying so: every rank takes it briefly on every start, even when the
op is built and the load takes a second; only a wait for a real build is news."""
SHM_OP = "deepspeed_shm_comm"
"""DeepSpeed's shared-memory all-reduce op: on a CPU host its torch backend builds (60-240 s the first time) and
starts it in every process group, but only `inference_all_reduce` (AutoTP inference layers) calls it; training's
all-reduce is torch.distributed's."""

CPU_OPS = ("CPUAdamBuilder", "FusedAdamBuilder")
"""What CPU runs load: fused Adam (ZeRO without offload), CPU Adam (optimizer offload). Not the shm all-reduce,
which zero-kit's runs never start (`skip_shm_op`)."""
GPU_OPS = ("CPUAdamBuilder", "FusedAdamBuilder")
"""What GPU runs JIT-build: fused Adam, and CPU Adam for optimizer offload (the shm op is CPU-only)."""


def extensions_dir(environ: dict[str, str] | None = None) -> Path:
    """TORCH_EXTENSIONS_DIR when set; else ~/.cache/zero_kit/torch_extensions/torch<v>-deepspeed<v>-<venv hash>.
    The venv's hash (sys.prefix: it also pins the Python) because builds record include paths, so two venvs with the
    same versions would still rebuild each other's."""
    from importlib.metadata import version

    environ = os.environ if environ is None else environ
    if environ.get(ENV):
        return Path(environ[ENV])
    venv = hashlib.sha1(sys.prefix.encode()).hexdigest()[:8]
    key = f"torch{version('torch')}-deepspeed{version('deepspeed')}-{venv}"
    return Path.home() / ".cache" / "zero_kit" / "torch_extensions" / key


def use_extensions_dir() -> Path:
    """Set TORCH_EXTENSIONS_DIR for this process and every rank it starts (hostfile ranks get it through the env
    file: launch.hostfile forwards TORCH_*), unless the user chose one.
    Set but empty counts as unset: torch would build into the current directory."""
    path = extensions_dir()
    if not os.environ.get(ENV):
        os.environ[ENV] = str(path)
    return path


def clock(epoch: float) -> str:
    """An epoch time as this host's wall clock (HH:MM:SS): when a holder took its lock or claim."""
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def owner_record() -> dict:
    """Who this process is, as an owner record names it: pid, host and when it took hold (epoch seconds)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}


def lock_holders(lock: Path) -> list[int]:
    """PIDs of this user's processes on this host that hold `lock` open (torch's builder keeps it open while it
    builds). Other users' processes are not looked at: they cannot build in this user's directories."""
    holders = []
    uid, target = os.getuid(), os.path.realpath(lock)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            if any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                holders.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return holders


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_ctime_ns


def clear_stale_lock(build_dir: Path, recheck_s: float = STALE_RECHECK_S, others_visible: bool = True) -> str:
    """With our flock held: 'free' (no lock), 'cleared' (a dead builder's lock removed, said in one line) or
    'live' (a live process on this host builds: torch waits on it; said in one line). `others_visible` False (a
    filesystem without flock, where another host's zero_kit build cannot be seen): never removed, only named."""
    lock = build_dir / LOCK
    first = _identity(lock)
    if first is None:
        return "free"
    holders = lock_holders(lock)
    if holders:
        warn(
            f"zero-kit: waiting for {build_dir.name}'s build by pid {holders[0]} (lock {lock} since {clock(first[1] / 1e9)})"
        )
        return "live"
    time.sleep(recheck_s)
    if _identity(lock) != first or lock_holders(lock):  # released (or re-taken) meanwhile: torch handles it
        return "free" if _identity(lock) is None else "live"
    if not others_visible:
        warn(
            f"zero-kit: waiting on {lock} (from {clock(first[1] / 1e9)}): no process on this host builds; this filesystem"
            " has no flock, so a build on another host cannot be ruled out: delete the file if none runs"
        )
        return "live"
    lock.unlink(missing_ok=True)
    warn(f"zero-kit: removed a stale build lock {lock} (from {clock(first[1] / 1e9)}; its builder is gone)")
    return "cleared"


def read_owner(build_dir: Path, name: str = OWNER) -> dict | None:
    try:
        return json.loads((build_dir / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, or being written
        return None


@contextmanager
def owner_lock(owner: Path, what: str) -> Iterator[bool]:
    """Hold the flock on `owner` (a small file, created when missing), waiting while a live process holds it (said in
    one line after QUIET_WAIT_S, naming `what`, its pid and host), then record ourselves in it. Yields False on a
    filesystem without flock, where nothing is held. The kernel drops an flock when its holder dies (also kill -9),
    so a dead holder is never waited on."""
    owner.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(owner, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked = _take_slot(fd, owner, what)
        if locked:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(owner_record()).encode(), 0)
        yield locked
    finally:
        os.close(fd)  # drops the flock


@contextmanager
def build_slot(build_dir: Path) -> Iterator[None]:
    """Hold the op's build: wait (saying on whom and since when) while another live zero_kit process builds it,
    then record ourselves as its builder and clear a dead builder's lock."""
    with owner_lock(build_dir / OWNER, f"{build_dir.name}'s build") as locked:
        clear_stale_lock(build_dir, others_visible=locked)
        yield


def _take_slot(fd: int, owner: Path, what: str) -> bool:
    """The slot's flock, waited for while a live holder has it; False on a filesystem without flock."""
    try:
        if not flock_within(fd, QUIET_WAIT_S):
            record = read_owner(owner.parent, owner.name) or {}
            since = f"since {clock(record['started'])}" if "started" in record else "since an unknown time"
            who = f"pid {record.get('pid', '?')} on {record.get('host', '?')}"
            warn(f"zero-kit: waiting for {what} by {who} ({since}) in {owner.parent}")
            fcntl.flock(fd, fcntl.LOCK_EX)  # a dead holder's flock is gone: this wait ends with a live holder
    except OSError as err:  # ENOLCK, EOPNOTSUPP: some network filesystems mounted without locks
        if isinstance(err, BlockingIOError):
            raise
        return False
    return True


def flock_within(fd: int, seconds: float) -> bool:
    """Take the exclusive flock on `fd`, trying for up to `seconds` (0: once); False if a live holder kept it.
    OSError other than BlockingIOError (no flock on this filesystem) goes to the caller."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def is_built(build_dir: Path, name: str) -> bool:
    return any(build_dir.glob(f"{name}*.so"))


OP_REASONS = {
    "cpu_adam": "the optimizer steps on the CPU (offload, or DeepSpeedCPUAdam)",
    "fused_adam": "the config's Adam runs fused in DeepSpeed's engine",
    SHM_OP: "DeepSpeed's shared-memory all-reduce for inference",
}
"""Why a run needs an op, said when it is built (the first run in an environment)."""


def announce(name: str, build_dir: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    why = f": {OP_REASONS[name]}" if name in OP_REASONS else ""
    warn(
        f"zero-kit: building DeepSpeed's {name} op{why} (first run in this environment only, ~1-4 min on {cores} "
        f"cores) into {build_dir}"
    )


def op_build_dir(name: str) -> Path:
    from torch.utils.cpp_extension import _get_build_directory  # torch's own rule (TORCH_EXTENSIONS_DIR or default)

    return Path(_get_build_directory(name, verbose=False))


ARCH = "TORCH_CUDA_ARCH_LIST"


def deepspeed_arch_list(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST in the form DeepSpeed's JIT builder parses. torch accepts arch-specific entries such as
    "9.0a" (sm_90a) or "10.0f"; DeepSpeed 0.19's `compute_capability_args` sorts the entries by int() of each
    dot-separated part and fails on them ("invalid literal for int() with base 10: '0a'", seen on an H200 image
    that sets "9.0a"). The letter is dropped ("9.0a" -> "9.0", "9.0a+PTX" -> "9.0+PTX"): the same GPUs, and
    DeepSpeed's ops use no arch-specific instructions. Separators as DeepSpeed reads them (";" or spaces)."""
    entries = value.replace(" ", ";").split(";")
    out = []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        arch, plus, suffix = entry.partition("+")
        major, dot, minor = arch.partition(".")
        minor = minor.rstrip("abcdefghijklmnopqrstuvwxyz")
        out.append(f"{major}{dot}{minor}{plus}{suffix}")
    return ";".join(dict.fromkeys(out))


@contextmanager
def arch_list_deepspeed_parses(name: str, say: bool) -> Iterator[None]:
    """While one op loads, TORCH_CUDA_ARCH_LIST in DeepSpeed's form (`deepspeed_arch_list`; DeepSpeed reads it for
    the nvcc flags on every load, built or not), said in one line when `say` (a first build); the user's value is
    back afterwards."""
    value = os.environ.get(ARCH)
    fixed = deepspeed_arch_list(value) if value else value
    if fixed == value or fixed is None:
        yield
        return
    if say:
        warn(
            f"zero-kit: {ARCH}={value!r} has entries DeepSpeed's op builder cannot parse; building its {name} op for {fixed!r}"
        )
    os.environ[ARCH] = fixed
    try:
        yield
    finally:
        os.environ[ARCH] = value


def guarded(jit_load: Callable) -> Callable:
    """DeepSpeed's OpBuilder.jit_load, inside our build slot, announced when first, beating the watchdog."""
    from zero_kit.watchdog import keep_alive

    def jit_load_guarded(builder, verbose: bool = True):
        build_dir = op_build_dir(builder.name)
        with keep_alive("build"), build_slot(build_dir):
            first = not is_built(build_dir, builder.name)
            if first:
                announce(builder.name, build_dir)
            with arch_list_deepspeed_parses(builder.name, say=first):
                return jit_load(builder, verbose)

    jit_load_guarded.zero_kit_guard = True
    return jit_load_guarded


def guard_op_builds() -> None:
    """Route DeepSpeed's JIT op loads through `guarded` (once per process), before anything loads an op:
    deepspeed.init_distributed loads the shm op on CPU, the optimizer cpu_adam or fused Adam."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    if not getattr(OpBuilder.jit_load, "zero_kit_guard", False):
        OpBuilder.jit_load = guarded(OpBuilder.jit_load)


SHM_DIR = Path("/dev/shm")


def skip_shm_op() -> bool:
    """Keep DeepSpeed from building and starting its shm op (SHM_OP) in this process: no build, and no 66 MB per
    rank in /dev/shm. DeepSpeed offers no switch: `TorchBackend.__init__` calls `build_shm_op`, which builds it
    whenever `deepspeed.ops.__compatible_ops__` says this machine can (deepspeed/comm/torch.py, 0.18 and 0.19; the
    dict is kept in the module so that edits persist). Marking it incompatible there is the narrowest supported
    way; `inference_all_reduce` then falls back to torch.distributed. Call before `deepspeed.init_distributed`.
    False when DeepSpeed is not installed or knows no such op (tests/unit/test_ops_build.py pins it)."""
    try:
        import deepspeed.ops
    except ImportError:
        return False
    compatible = deepspeed.ops.__compatible_ops__
    if SHM_OP not in compatible:
        return False
    compatible[SHM_OP] = False
    return True


def init_distributed(backend: str, timeout_s: float | None = None) -> None:
    """deepspeed.init_distributed without the shm op training never uses (`skip_shm_op`), its other op loads
    guarded (no dead lock waited on), and no shared memory left behind where the op was started all the same
    (`release_shm_buffer`)."""
    from datetime import timedelta

    import deepspeed

    skip_shm_op()
    guard_op_builds()
    deepspeed.init_distributed(
        dist_backend=backend, **({} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)})
    )
    release_shm_buffer()


def shm_buffer(rank: int, environ: dict[str, str] | None = None) -> Path:
    """The name DeepSpeed's shm op gives a rank's all-reduce workspace (deepspeed/ops/csrc/cpu/comm/shm.cpp:
    user id, MASTER_ADDR, MASTER_PORT, rank)."""
    env = os.environ if environ is None else environ
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    return SHM_DIR / f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"


def release_shm_buffer() -> bool:
    """On CPU with every rank on one host, DeepSpeed's init_distributed loads the shm all-reduce op, which creates
    a 66 MB POSIX shared-memory file per rank, maps every rank's, and never unlinks them: each run left
    ranks x 66 MB of RAM in /dev/shm for good (about 15 GiB on this project's machine after a day of tests). Once
    every rank has mapped every buffer (the barrier; until then a rank's init waits for the others' names to
    appear), each rank removes its own name; the mappings stay valid, and the memory is freed when the last rank
    ends, also after a kill. True when this rank removed one."""
    import torch.distributed as dist
    from deepspeed import comm

    backend = getattr(comm.comm, "cdb", None)
    world = dist.get_world_size() if dist.is_initialized() else 0
    # the same answer on every rank (one host, one accelerator kind), so either all of them meet in the barrier or none
    if getattr(backend, "shm_comm_op", None) is None or int(os.environ.get("LOCAL_SIZE", -1)) != world:
        return False
    dist.barrier()
    try:
        shm_buffer(dist.get_rank()).unlink()
    except FileNotFoundError:
        return False
    return True


def default_ops() -> tuple[str, ...]:
    import torch

    return GPU_OPS if torch.cuda.is_available() else CPU_OPS


def op_builders(names: tuple[str, ...]) -> list:
    """The named DeepSpeed op builders for this machine's accelerator, or a UserError naming the first unknown."""
    from deepspeed.accelerator import get_accelerator

    from zero_kit.errors import UserError

    builders = []
    for name in names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None or type(builder).__name__ == "NotImplementedBuilder":
            raise UserError(
                f"--op {name}: DeepSpeed has no such op builder for this machine's accelerator",
                f"name a builder class, e.g. {', '.join(default_ops())}",
            )
        builders.append(builder)
    return builders


def build_ops(names: tuple[str, ...]) -> list[tuple[str, float]]:
    """Load (building when needed) each named DeepSpeed op builder, guarded; returns (op, seconds) per op."""
    guard_op_builds()
    done = []
    for builder in op_builders(names):
        start = time.monotonic()
        builder.load(verbose=False)
        done.append((builder.name, time.monotonic() - start))
    return done

"""Where this process runs and how a rank lives and ends: the one place that reads the launcher's environment.

`deepspeed`, `torchrun` and `accelerate launch` all export RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
MASTER_PORT to each rank; SLURM's srun exports SLURM_PROCID / SLURM_NTASKS instead, which we translate.
torch is imported inside the functions that need it, so CLI commands that never start ranks stay fast.
"""

from __future__ import annotations

import os
import socket
import sys

WORLD_SIZE_ENV = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
"""Where launchers put the number of ranks, in the order they are trusted."""

# The rendezvous ports, declared once (zero_kit.launch and the commands read them from here).
RENDEZVOUS_PORT = 29500
"""torch's and the deepspeed launcher's own default MASTER_PORT: a rank under srun without one, and
`zero-kit train --hostfile` (the rendezvous is on the first host, whose free ports this host cannot see)."""
MULTI_NODE_PORT = 29700
"""`zero-kit launch` and its sbatch scripts; `zero-kit bench` starts here (strategy i: MULTI_NODE_PORT + i)."""


def under_launcher(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return "WORLD_SIZE" in env and "RANK" in env


def world_size_from_env(environ: dict[str, str]) -> tuple[int | None, str]:
    """The launcher's world size and the variable it came from, (None, "") when no launcher set one.

    Raises ValueError naming the variable when it holds something other than a positive integer."""
    for name in WORLD_SIZE_ENV:
        raw = environ.get(name, "").strip()
        if raw:
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"{name}={raw!r} is not a positive integer")
            return int(raw), name
    return None, ""


def local_size_from_env(environ: dict[str, str]) -> int | None:
    """The launcher's ranks on this node (torchrun's LOCAL_WORLD_SIZE, the deepspeed launcher's LOCAL_SIZE); None
    when no launcher set one."""
    raw = environ.get("LOCAL_WORLD_SIZE") or environ.get("LOCAL_SIZE") or ""
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else None


THREADS_ENV = "OMP_NUM_THREADS"


def rank_threads(environ: dict[str, str], cores: int) -> int:
    """Threads for one rank's intra-op pool: the usable cores shared by the ranks on this node, at least one.
    No more busy threads than cores; DeepSpeed's own core binding gives the same. benchmarks/startup/ has the A/B."""
    return max(1, cores // (local_size_from_env(environ) or 1))


def set_rank_threads() -> int | None:
    """OMP_NUM_THREADS for this rank, before torch's first import reads it (and torch's pool, if torch is loaded
    already), unless it is set: a user's value wins (torchrun's own 1 for several ranks reads the same). With the
    variable set, accelerate neither applies its own rule (physical cores / local ranks) nor warns about it."""
    if os.environ.get(THREADS_ENV, "").strip():
        return None
    threads = rank_threads(dict(os.environ), len(os.sched_getaffinity(0)))
    os.environ[THREADS_ENV] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    return threads


THP_ENV = "THP_MEM_ALLOC_ENABLE"
"""torch's own switch (c10/core/alloc_cpu.cpp): CPU tensors of 2 MiB or more get transparent huge pages (madvise),
read once, at the process's first CPU allocation."""
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")
"""NVIDIA's and AMD's driver device files: a host with either is a GPU host, judged without importing torch."""


def gpu_host() -> bool:
    """An NVIDIA or AMD driver on this host (GPU_DEVICE_FILES): its ranks will likely train on GPUs. Asked of the
    device files, not torch, whose import would cost a CPU run's checks seconds."""
    return any(os.path.exists(path) for path in GPU_DEVICE_FILES)


HEAP_REUSE_BYTES = 32 << 20
"""glibc's largest dynamic mmap threshold (64-bit): a block this large is mapped afresh at every allocation, a smaller
one comes back from glibc's heap once it has been freed."""


def set_rank_huge_pages(zero_stage: int | None, params: int | None, precision: str = "fp32") -> bool:
    """THP_MEM_ALLOC_ENABLE=1 (torch: CPU tensors of 2 MiB or more in transparent huge pages) for a CPU rank of
    ZeRO-1/2 whose `params` trained parameters, gathered in one piece, are HEAP_REUSE_BYTES or more; before torch's
    import. Not where the variable is set (the user's value wins, 0 included), torch is loaded already (too late:
    torch has read it) or the host has a GPU (not measured there). ZeRO-1/2 all-gather every updated parameter in
    one gloo call a step, into a new tensor that size (ProcessGroupGloo), which the kernel otherwise faults in 4 KiB
    at a time: on 2 CPU ranks one 105 MiB all-gather took 91-114 ms in 4 KiB pages and 47 ms in huge pages, and
    ZeRO-1/2 on a 58M LLaMA rose from 0.72x to 0.80-0.81x DDP's tokens/s over all steps, peak RSS unchanged. Below
    the threshold glibc's heap reuses the block: the 3.1M bench model (12 MiB) was ~5% slower with it. ZeRO-3, DDP
    and FSDP2 did not get faster and ZeRO-3 held ~40 MiB more (benchmarks/comm_buckets, "Huge pages on CPU ranks").
    Returns whether it set the variable."""
    size = (params or 0) * (2 if precision in ("bf16", "fp16") else 4)
    if zero_stage not in (1, 2) or size < HEAP_REUSE_BYTES:
        return False
    if os.environ.get(THP_ENV, "").strip() or "torch" in sys.modules or gpu_host():
        return False
    os.environ[THP_ENV] = "1"
    return True


def slurm_to_torch_env(env: dict[str, str]) -> dict[str, str]:
    """srun started one task per rank: derive the torch.distributed variables from SLURM's (empty otherwise)."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env or under_launcher(env):
        return {}
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
        "MASTER_PORT": env.get("MASTER_PORT", str(RENDEZVOUS_PORT)),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether a rendezvous server could not listen on `port` here: bound as torch's TCPStore binds it (every
    address, SO_REUSEADDR, so a closed connection's TIME_WAIT does not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return True
    return False


def single_process_env(port: int) -> dict[str, str]:
    """A world of one, so DeepSpeed and the Trainer need no launcher for a job started without one."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def device_and_backend() -> tuple[str, str]:
    """This rank's device and process-group backend: its own GPU and NCCL, or the CPU and gloo."""
    import torch

    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return f"cuda:{local}", "nccl"
    return "cpu", "gloo"


def initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    """All ranks meet (no-op without a process group)."""
    import torch.distributed as dist

    if initialized():
        dist.barrier()


def collective_device():
    """Where a tensor handed to a collective of the default group must live: this rank's current GPU under NCCL
    (NCCL reduces only CUDA tensors: a CPU tensor fails with "No backend type associated with device type cpu"),
    else the CPU."""
    import torch
    import torch.distributed as dist

    if initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on at least one (just `flag` without a group)."""
    return any_rank_and_sum(flag)[0]


def any_rank_and_sum(flag: bool, count=0) -> tuple[bool, int]:
    """`any_rank(flag)` and the sum of `count` over the ranks, in one all-reduce (a SUM of [flag, count]). `count`:
    an int or a tensor, added where it lives (nothing waits for its device before the collective). Without a
    group: this rank's own."""
    import torch

    values = torch.zeros(2, dtype=torch.int64, device=collective_device())
    values[0] = 1 if flag else 0
    values[1] += torch.as_tensor(count).to(device=values.device, dtype=torch.int64)
    if initialized():
        import torch.distributed as dist

        dist.all_reduce(values)
    flagged, total = values.tolist()
    return flagged > 0, total


def end_process_group(finished: bool) -> None:
    """Destroy the default process group, if any. After a finished run the ranks meet once more first, so none
    tears down (or exits, which makes the `deepspeed` launcher kill the rest) while another still talks to it;
    after a failure they do not wait for each other."""
    import torch.distributed as dist

    if initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def is_multi_rank_process() -> bool:
    """This process is one rank of a multi-rank job and has torch loaded."""
    return "torch" in sys.modules and under_launcher() and int(os.environ["WORLD_SIZE"] or 1) > 1


def exit_rank(code: int):
    """A rank whose work is done and saved leaves with os._exit, flushing its output first.

    Interpreter teardown runs C++ destructors of gloo/DeepSpeed objects while the other ranks are gone
    or being killed by the launcher (which terminates every rank once one exits non-zero, e.g. 75 after
    preemption); now and then that aborts (SIGABRT, "terminate called without an active exception") and
    the launcher then reports -6 instead of the rank's real exit code."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

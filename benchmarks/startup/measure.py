"""One `zero-kit train` measured from outside: the command's wall time, each rank's peak resident memory (the
kernel's high-water mark, VmHWM, read from /proc while the rank lives) and the run's own start-up record
(OUTPUT/zero_kit_startup.json: time to first step by stage, rank 0). Shared by the startup and data_scale studies."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

POLL_S = 0.25


def train(args: list[str], output: Path, log: Path, extra_env: dict[str, str] | None = None,
          stop_at_first_step: bool = False) -> dict:  # fmt: skip
    """Run `python -m zero_kit.cli train ARGS --output OUTPUT` (its output to `log`); the measurements.
    stop_at_first_step: SIGKILL the job (its own session) once the start-up record is written, sparing the save of
    a large model's checkpoint that follows the last step."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "ZERO_KIT_STARTUP_MEMORY": "1",
        **(extra_env or {}),
    }
    cmd = [sys.executable, "-m", "zero_kit.cli", "train", *args, "--output", str(output)]
    startup_file = output / "zero_kit_startup.json"
    startup_file.unlink(missing_ok=True)
    peaks: dict[int, int] = {}
    cpu: dict[int, float] = {}  # CPU seconds each rank used so far: on a shared host, wall time is also others' load
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        while proc.poll() is None:
            for pid in _rank_pids(proc.pid):
                peaks[pid] = max(peaks.get(pid, 0), _vm_hwm(pid))
                cpu[pid] = max(cpu.get(pid, 0.0), _cpu_s(pid))
            if stop_at_first_step and startup_file.is_file():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(POLL_S)
    wall = time.perf_counter() - started
    return {
        "command": " ".join(["zero-kit", "train", *args, "--output", str(output)]),
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_mib_per_rank": [round(peak / 2**20) for _, peak in sorted(peaks.items())],
        "cpu_s_per_rank": [round(seconds, 1) for _, seconds in sorted(cpu.items())],
        "startup": json.loads(startup_file.read_text()) if startup_file.is_file() else None,
    }


def _rank_pids(root: int) -> list[int]:
    """The ranks under `root`: processes running `-m zero_kit.cli` with RANK set (not the launchers, whose argv
    names zero_kit.cli only after deepspeed.launcher; not the relaunching parent, which has no RANK)."""
    pids = []
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            argv = child.cmdline()
            launcher = any("deepspeed.launcher" in a for a in argv)
            if "zero_kit.cli" in argv and not launcher and "RANK" in child.environ():
                pids.append(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return pids


def _cpu_s(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0.0
    return times.user + times.system


def _vm_hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def environment() -> dict:
    """Versions and hardware beside every number."""
    import deepspeed
    import torch
    import transformers

    import zero_kit

    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "zero_kit": zero_kit.__version__,
        "commit": _commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "deepspeed": deepspeed.__version__,
        "cpu": _cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": [round(x, 1) for x in os.getloadavg()],
    }


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""

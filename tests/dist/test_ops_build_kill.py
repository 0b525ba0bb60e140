"""A run killed in the middle of an op build no longer hangs the next one.

The op is a tiny one (tiny_op_build.py: one pybind11 function) built through DeepSpeed's own JIT path
(OpBuilder.jit_load -> torch.utils.cpp_extension.load -> FileBaton `lock` + ninja + c++), the path cpu_adam and
the shm op take; only the compile is seconds instead of the 60-240 s of a real DeepSpeed op on 2 cores, which CI
cannot afford twice. Everything happens in a temporary TORCH_EXTENSIONS_DIR, never in the shared build cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.jobs import env, start, wait_for

# serial: kills an op build midway and times the next one; never beside another test
pytestmark = [pytest.mark.dist, pytest.mark.serial]
PROBE = Path(__file__).with_name("tiny_op_build.py")


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL every process of the run's session: ninja starts each compile in a process group of its own, so
    killing the run's group alone would leave the compiler running."""
    for pid in (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()):
        try:
            if os.getsid(pid) == proc.pid:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    proc.wait(timeout=30)


def test_a_build_killed_midway_leaves_a_lock_that_the_next_run_clears(tmp_path):
    from tiny_op_build import SOURCE

    source = tmp_path / "tiny.cpp"
    source.write_text(SOURCE)
    extensions = tmp_path / "extensions"
    build_env = env(TORCH_EXTENSIONS_DIR=str(extensions))
    build_dir, lock = extensions / "zk_tiny", extensions / "zk_tiny" / "lock"

    first = start([sys.executable, str(PROBE), str(source), "--guard"], tmp_path / "first.log", env=build_env)
    try:
        wait_for(lock.exists, "the first run's build lock", first, timeout=120)
        time.sleep(0.5)  # the compiler is running
    finally:
        _kill_session(first.proc)  # the run, its ninja and its compiler: what a timeout or a scheduler does
    assert lock.exists() and not list(build_dir.glob("*.so")), f"not killed mid-build:\n{first.text()}"

    # Without zero_kit's guard the next load waits on the dead builder's lock forever.
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, str(PROBE), str(source)], env=build_env, capture_output=True, timeout=8)

    start_s = time.monotonic()
    second = subprocess.run(
        [sys.executable, str(PROBE), str(source), "--guard"], env=build_env, capture_output=True, text=True, timeout=240
    )
    took = time.monotonic() - start_s
    assert second.returncode == 0 and "tiny op says 42" in second.stdout, second.stderr[-3000:]
    assert f"removed a stale build lock {lock}" in second.stderr
    assert "building DeepSpeed's zk_tiny op (first run in this environment only" in second.stderr
    assert not lock.exists()
    print(f"the next build finished in {took:.0f} s")

"""Resource limits through the real `zero-kit train` CLI (one process, CPU): a clear message and exit 2, never a
traceback. Real filesystems, not patches: tmpfs mounts (tests run as root) make a read-only output directory
and a disk that fills up in the middle of a run; ZERO_KIT_HOST_MEM_BYTES stands in for a small host."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.jobs import FAST, env, pythonpath_with, zero_kit
from zero_kit.checkpoints import store
from zero_kit.train.guards.preflight import EXIT_DISK_FULL, HOST_MEM_ENV

pytestmark = [pytest.mark.dist, pytest.mark.serial]  # a full disk and its timing: never beside another test


@contextmanager
def tmpfs(path: Path, size_mb: int, *, read_only: bool = False):
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size_mb}m" + (",ro" if read_only else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def _train(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    cmd = zero_kit("train", "--master-port", "29850", *FAST, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env(**extra_env))


def test_read_only_output_and_missing_nvme_in_one_message_before_any_heavy_import(tmp_path):
    # Both are checked with the other inputs, before torch or accelerate load (issue 23); the host RAM check needs
    # the resolved run and stays preflight's (tests/unit/test_preflight.py).
    missing_nvme = tmp_path / "no-nvme"
    with tmpfs(tmp_path / "ro", 20, read_only=True) as ro:
        proc = _train(
            "--output",
            str(ro / "run"),
            "--stage",
            "3",
            "--offload-optimizer",
            "cpu",
            "--offload-param",
            "nvme",
            "--nvme-path",
            str(missing_nvme),
            **{HOST_MEM_ENV: str(2**30)},
        )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    err = proc.stderr
    assert "2 problems in the inputs of zero-kit train" in err
    assert f"--output {ro / 'run'}: cannot write in {ro} (Read-only file system" in err
    assert f"--nvme-path {missing_nvme}: does not exist" in err and "mkdir -p" in err
    assert "accelerate" not in err and "Warning" not in err


FILL_SITE = '''"""The disk fills up while a checkpoint is saved: when the run creates ZK_FILL_AT (a checkpoint directory), a file
takes every byte of ZK_FILL_DIR's filesystem but 1 MiB (what another job's files would do), so the save's own
writes meet the real ENOSPC of that filesystem."""
import os

_makedirs = os.makedirs


def makedirs(name, *args, **kwargs):
    _makedirs(name, *args, **kwargs)
    if os.path.basename(os.path.normpath(str(name))) == os.environ.get("ZK_FILL_AT"):
        fd = os.open(os.path.join(os.environ["ZK_FILL_DIR"], "filler"), os.O_CREAT | os.O_WRONLY)
        written, block = 0, bytes(2**20)
        try:
            while True:
                written += os.write(fd, block)
        except OSError:  # ENOSPC: the filesystem is full; give 1 MiB back
            os.ftruncate(fd, max(0, written - 2**20))
        os.close(fd)


os.makedirs = makedirs
'''


def test_disk_full_during_a_save_is_a_message_and_resume_skips_the_partial_checkpoint(tmp_path):
    # 200 MB: the preflight's check (the checkpoints --save-total-limit keeps at once, ~47 MB each for the tiny model
    # in fp32) passes; the disk then fills up when checkpoint-2 is begun.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FILL_SITE)
    with tmpfs(tmp_path / "small", 200) as small:
        out = small / "run"
        proc = _train("--output", str(out), "--stage", "2", "--max-steps", "3", "--save-steps", "1",
                      PYTHONPATH=pythonpath_with(site), ZK_FILL_AT="checkpoint-2", ZK_FILL_DIR=str(small))  # fmt: skip
        complete = store.newest_complete(out)
        partial = [p.name for p in store.list_checkpoints(out) if not store.is_complete(p)]
    assert proc.returncode == EXIT_DISK_FULL, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"--output {out}: the disk is full (" in proc.stderr and "while writing checkpoint-2" in proc.stderr
    assert "checkpoint-1 is complete and intact" in proc.stderr
    assert "--resume auto continues from checkpoint-1" in proc.stderr
    assert complete is not None and complete.name == "checkpoint-1"
    assert partial == ["checkpoint-2"]

"""Rig use from tests (tests/rigs: root, network namespaces, daemons): the marks of a test module that needs
a rig, and the namespaces that exist now (a rig must leave none behind)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def rig_marks(*binaries: str) -> list[pytest.MarkDecorator]:
    """`pytestmark` of a multinode test module: the tier's marker, and a skip unless root (and `binaries` on PATH)
    with the reason. In CI a skip fails (tests/conftest.py): the rigs must run there."""
    missing = [name for name in binaries if shutil.which(name) is None]
    reason = "the rigs need root" + (f" and {', '.join(binaries)}" if binaries else "")
    return [pytest.mark.multinode, pytest.mark.skipif(os.geteuid() != 0 or bool(missing), reason=reason)]


def namespaces() -> list[str]:
    """The network namespaces now (`ip netns list`), by name."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]

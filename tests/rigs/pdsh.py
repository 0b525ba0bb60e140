"""Two ssh-reachable hosts for DeepSpeed's default multi-node launcher (pdsh + ssh): hosts PREFIX0 / PREFIX1 at
10.78.SUBNET.1 / .2 (netns.py), each running its own sshd in its own UTS namespace named after the host. Host and
client keys, sshd config and logs live under /tmp/PREFIX-pdsh; /etc/netns/NS/hosts and /etc/netns/NS/ssh/ssh_config
make plain `ssh PREFIX1` (or its address) log in as root inside the namespaces, with strict host key checking.
Root's ~/.ssh and the real /etc/ssh are never touched.

The launcher must run inside host 0 (the root namespace cannot reach 10.78.SUBNET.x):
    rig.run(["deepspeed", "--hostfile", H, "--master_addr", rig.hosts.addresses[0], "script.py"], cwd=launch_dir)
Remote ranks get only what DeepSpeed exports (PYTHON*, MLFLOW*, UCX*, MV2* variables and the `.deepspeed_env`
lines of the launch directory and of root's home): write_deepspeed_env() gives them the private
TORCH_EXTENSIONS_DIR.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from tests.rigs.base import (
    ETC_NETNS,
    OnHosts,
    RigError,
    private_extensions_dir,
    rank_path,
    require,
    rig_session,
    run,
    start_daemon,
    wait_until,
    write_etc_hosts,
)
from tests.rigs.netns import TwoHosts, make_hosts, remove_daemon_rig

# StrictModes no: the key files live under /tmp (world-writable), which StrictModes rejects. UsePAM no: no
# PAM/logind session needed. PidFile none: the rig keeps the PID itself; two sshd must not share /run/sshd.pid.
# ClientAlive* (here) and ServerAlive* (SSH_CONFIG): a cut link ends both ends of a session in ~15-20 s, as on a
# cluster's ssh setup; without them TCP keeps a silent session for hours, and pdsh, waiting on it, never returns.
SSHD_CONFIG = """HostKey {root}/host_key
PidFile none
PermitRootLogin prohibit-password
AuthorizedKeysFile {root}/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
ClientAliveInterval 5
ClientAliveCountMax 3
"""
SSH_CONFIG = """Host *
  User root
  IdentityFile {root}/id
  IdentitiesOnly yes
  UserKnownHostsFile {root}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
  ServerAliveInterval 5
  ServerAliveCountMax 3
  LogLevel ERROR
"""


def pdsh_dir(prefix: str) -> Path:
    return Path(f"/tmp/{prefix}-pdsh")


@dataclass(frozen=True)
class SshHosts(OnHosts):
    def start_sshd(self, node: int) -> int:
        """Start host `node`'s sshd (at `up`, or again after a test killed everything on the host: a reboot)."""
        sshd = [shutil.which("sshd", path="/usr/sbin:/usr/bin") or "/usr/sbin/sshd",  # sshd wants an absolute path
                "-D", "-e", "-f", str(self.root / "sshd_config")]  # fmt: skip
        name = self.hosts.names[node]
        return start_daemon(name, name, sshd, self.root / f"sshd{node}.log", self.root / f"sshd{node}.pid")

    def ssh(self, node: int, remote_command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`ssh HOST command` from host 0 to host `node`, through the same client path pdsh uses."""
        return self.run(["ssh", self.hosts.names[node], remote_command], timeout=timeout)


def write_hostfile(path: str | Path, hosts: Sequence[str], slots: int = 1) -> Path:
    """A DeepSpeed hostfile: one `HOST slots=N` line per host (names or addresses), as zero_kit.launch writes it."""
    from zero_kit.launch import hostfile_text

    path = Path(path)
    path.write_text(hostfile_text(list(hosts), slots), encoding="utf-8")
    return path


def deepspeed_env_defaults() -> dict[str, str]:
    """What remote ranks need and would not get otherwise (their PATH is the ssh login PATH): the private
    TORCH_EXTENSIONS_DIR and the same PATH as the launcher's host (see base.rank_path: one ninja for all)."""
    return {"TORCH_EXTENSIONS_DIR": str(private_extensions_dir()), "PATH": rank_path(), "OMP_NUM_THREADS": "1"}


def write_deepspeed_env(directory: str | Path, env: Mapping[str, str] | None = None) -> Path:
    """DIRECTORY/.deepspeed_env with KEY=VALUE lines for every host's ranks. Refuses what breaks a launch: a blank
    line crashes the launcher, and GLOO_SOCKET_IFNAME would be the same on every host (the other host then fails
    with "Unable to find address" and the surviving rank hangs); it is not needed, host names resolve."""
    env = dict(deepspeed_env_defaults() if env is None else env)
    bad = [key for key, value in env.items() if not key or "=" in key or "\n" in key + value or not value.strip()]
    if bad or "GLOO_SOCKET_IFNAME" in env:
        raise RigError(f".deepspeed_env: refusing {sorted(bad) or ['GLOO_SOCKET_IFNAME']} (blank, multi-line or "
                       "GLOO_SOCKET_IFNAME, which differs per host)")  # fmt: skip
    path = Path(directory, ".deepspeed_env")
    path.write_text("".join(f"{key}={value}\n" for key, value in env.items()), encoding="utf-8")
    return path


def _write_keys_and_configs(root: Path, hosts: TwoHosts) -> None:
    root.mkdir(parents=True)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir (the service makes it)
    for key in ("host_key", "id"):  # one host key for both hosts: fine for a test
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / key)])
    shutil.copy(root / "id.pub", root / "authorized_keys")
    host_key = " ".join((root / "host_key.pub").read_text().split()[:2])
    (root / "known_hosts").write_text(f"{','.join([*hosts.addresses, *hosts.names])} {host_key}\n")
    (root / "sshd_config").write_text(SSHD_CONFIG.format(root=root), encoding="utf-8")
    write_etc_hosts(hosts.names, hosts.addresses)
    for name in hosts.names:
        # `ip netns exec` bind-mounts /etc/netns/NS/ssh over /etc/ssh in NS only: pdsh's ssh uses our key
        (ETC_NETNS / name / "ssh").mkdir(parents=True, exist_ok=True)
        (ETC_NETNS / name / "ssh" / "ssh_config").write_text(SSH_CONFIG.format(root=root), encoding="utf-8")


def ssh_up(prefix: str, subnet: int, timeout: float = 15) -> SshHosts:
    """Build the hosts and sshd (after clearing what a crashed run left); ready when both answer `ssh HOST true`."""
    require("ip", "sshd", "ssh-keygen", "pdsh")
    ssh_down(prefix)
    root = pdsh_dir(prefix)
    try:
        hosts = make_hosts(prefix, subnet)
        _write_keys_and_configs(root, hosts)
        rig = SshHosts(hosts, root)
        for node in (0, 1):
            rig.start_sshd(node)
        wait_until(lambda: all(rig.ssh(n, "true", 10).returncode == 0 for n in (0, 1)), timeout,
                   f"sshd (see {root}/sshd*.log)")  # fmt: skip
        return rig
    except BaseException:
        ssh_down(prefix)
        raise


def ssh_down(prefix: str) -> None:
    """Stop sshd by PID file, kill everything left in the namespaces (sessions, ranks), delete the namespaces,
    /tmp/PREFIX-pdsh and /etc/netns/PREFIX0, PREFIX1. Safe to call when nothing is up."""
    root = pdsh_dir(prefix)
    remove_daemon_rig(prefix, root, [root / "sshd0.pid", root / "sshd1.pid"])


def ssh_hosts(prefix: str, subnet: int, timeout: float = 15) -> AbstractContextManager[SshHosts]:
    """The two sshd hosts for the body; always removed on exit, also when the body fails or times out."""
    return rig_session(lambda: ssh_up(prefix, subnet, timeout), lambda: ssh_down(prefix))

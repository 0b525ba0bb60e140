"""A real two-node Slurm 22.05 cluster on one machine: nodes PREFIX0 (10.78.SUBNET.1, also slurmctld) and PREFIX1
(10.78.SUBNET.2), each a network namespace from netns.py, one slurmd each in its own UTS namespace named after
the node, one munged with its own key and socket, state and logs under /tmp/PREFIX-slurm. Every node has two
fake GPUs (gres backed by /dev/null copies), so scripts with `#SBATCH --gpus-per-node=1|2` run.

Clients run inside node 0, where the controller listens:  `cluster.sbatch_wait(script)`, `cluster.run(argv)`.
Nothing under the real /etc is touched except /etc/netns/PREFIX0 and PREFIX1 (removed by `slurm_down`).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from tests.rigs.base import OnHosts, require, rig_session, run, start_daemon, wait_until, write_etc_hosts
from tests.rigs.netns import TwoHosts, make_hosts, remove_daemon_rig

DAEMONS = ("slurmd1", "slurmd0", "slurmctld", "munged")  # stop order: munged last, the others talk through it


def slurm_dir(prefix: str) -> Path:
    return Path(f"/tmp/{prefix}-slurm")


@dataclass(frozen=True)
class SlurmCluster(OnHosts):
    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def partition(self) -> str:
        return self.hosts.names[0][:-1]

    def command(self, argv: Sequence[str], node: int = 0) -> list[str]:
        """argv that runs a Slurm client (or anything) on `node` with SLURM_CONF pointing at this cluster."""
        return self.hosts.exec(node, "env", f"SLURM_CONF={self.conf}", *argv)

    def sbatch_wait(self, script: str | Path, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """`sbatch --wait SCRIPT`: exits with the largest task exit code once the job ends."""
        return self.run(["sbatch", "--wait", str(script)], timeout=timeout, **kwargs)

    def srun(self, argv: Sequence[str], nodes: int = 2, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return self.run(["srun", f"--nodes={nodes}", "--ntasks-per-node=1", *argv], timeout=timeout, **kwargs)

    def restart_slurmd(self, node: int, timeout: float = 60) -> None:
        """A node back after a reboot: start its slurmd again and wait until both nodes are idle."""
        start_slurmd(self.root, self.hosts, node)
        wait_until(lambda: _all_idle(self), timeout, f"slurm nodes after restarting slurmd{node}", interval=0.5)

    def squeue(self) -> str:
        return self.run(["squeue", "-h", "-o", "%i %T %j"], timeout=30).stdout

    def scancel(self, job_id: int | None = None) -> None:
        """Cancel one job, or every job in the partition."""
        self.run(["scancel", str(job_id)] if job_id else ["scancel", "-p", self.partition], timeout=30)

    def job_state(self, job_id: int) -> tuple[str, int]:
        """(JobState, Restarts) of a job from `scontrol show job`: Restarts counts Slurm's requeues of it."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=30).stdout
        state, restarts = re.search(r"JobState=(\S+)", out), re.search(r"Restarts=(\d+)", out)
        return (state.group(1) if state else "UNKNOWN", int(restarts.group(1)) if restarts else 0)

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())


def slurm_conf(prefix: str, root: Path, hosts: TwoHosts) -> str:
    (name0, name1), (addr0, addr1) = hosts.names, hosts.addresses
    return f"""ClusterName={prefix}
SlurmctldHost={name0}({addr0})
# root daemons, own munge socket, state and spool under {root} (%n = node name: one spool per slurmd)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long before it may start again (120 s by default); 10 s here
AuthInfo=socket={root}/munge/sock,cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pidfile
SlurmdPidFile={root}/slurmd-%n.pidfile
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
MailProg=/bin/true
# no systemd, no cgroups, no accounting database
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# the main scheduling loop every 2 s (default 60): a requeued job waits for its begin time (cred_expire below),
# an event no other pass follows, so it would start up to a minute late
SchedulerParameters=sched_interval=2
ReturnToService=2
# sbatch --wait polls every 2 s only while MinJobAge/2 <= 2; the default (300) backs off to 32 s
MinJobAge=5
# A lost node ends its job only when slurmctld declares it DOWN (srun --kill-on-bad-exit cannot finish a step on a
# node that does not answer): SlurmdTimeout after its last answer. 300 s by default; 10 s here (tests wait for it).
SlurmdTimeout=10
GresTypes=gpu
NodeName={name0} NodeAddr={addr0} CPUs=2 Gres=gpu:2 State=UNKNOWN
NodeName={name1} NodeAddr={addr1} CPUs=2 Gres=gpu:2 State=UNKNOWN
PartitionName={prefix} Nodes={name0},{name1} Default=YES MaxTime=INFINITE State=UP
"""


def _write_config(prefix: str, root: Path, hosts: TwoHosts) -> None:
    for sub in ("state", "munge", *(f"spool-{name}" for name in hosts.names)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (root / "slurm.conf").write_text(slurm_conf(prefix, root, hosts), encoding="utf-8")
    # Slurm drops a gpu gres without File= (the node goes INVAL) and wants device nodes: copies of /dev/null.
    for index in (0, 1):
        run(["mknod", str(root / f"gpu{index}"), "c", "1", "3"])
    (root / "gres.conf").write_text(f"Name=gpu File={root}/gpu[0-1]\n", encoding="utf-8")
    # slurmd 22.05 always loads a cgroup plugin; under `ip netns exec` /sys is remounted, /sys/fs/cgroup is empty
    # and autodetection fails. Naming v1 skips it; with proctrack/linuxproc and task/none no cgroup is created.
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n", encoding="utf-8")


def _start_daemons(root: Path, hosts: TwoHosts) -> None:
    conf = f"SLURM_CONF={root}/slurm.conf"
    m = root / "munge"
    # Own key and path socket: never touches a system munged; path (not abstract) unix sockets cross network
    # namespaces, so one munged in node 0 serves both nodes.
    munged = ["munged", "-F", "--force", f"--origin={hosts.addresses[0]}", f"--socket={m}/sock",
              f"--key-file={m}/munge.key", f"--log-file={m}/log", f"--pid-file={m}/pid", f"--seed-file={m}/seed"]  # fmt: skip
    start_daemon(hosts.names[0], hosts.names[0], munged, root / "munged.out", root / "munged.pid")
    wait_until(lambda: (m / "sock").exists(), 10, "munged socket")
    start_daemon(hosts.names[0], hosts.names[0], ["env", conf, "slurmctld", "-D", "-i"],
                 root / "slurmctld.out", root / "slurmctld.pid")  # fmt: skip
    for node in (0, 1):
        start_slurmd(root, hosts, node)


def start_slurmd(root: Path, hosts: TwoHosts, node: int) -> int:
    """Start node `node`'s slurmd (at `up`, or again after a test killed everything on the node: a reboot)."""
    name = hosts.names[node]
    argv = ["env", f"SLURM_CONF={root}/slurm.conf", "slurmd", "-D"]
    return start_daemon(name, name, argv, root / f"slurmd{node}.out", root / f"slurmd{node}.pid")


def slurm_up(prefix: str, subnet: int, timeout: float = 30) -> SlurmCluster:
    """Build the cluster (after clearing what a crashed run left) and wait until both nodes are idle."""
    require("ip", "munged", "slurmctld", "slurmd", "sbatch")
    slurm_down(prefix)
    root = slurm_dir(prefix)
    try:
        hosts = make_hosts(prefix, subnet)
        write_etc_hosts(hosts.names, hosts.addresses)
        _write_config(prefix, root, hosts)
        _start_daemons(root, hosts)
        cluster = SlurmCluster(hosts, root)
        wait_until(lambda: _all_idle(cluster), timeout, f"slurm nodes (see {root}/*.log)", interval=0.3)
        return cluster
    except BaseException:
        slurm_down(prefix)
        raise


def _all_idle(cluster: SlurmCluster) -> bool:
    states = cluster.node_states()
    return sorted(states) == sorted(cluster.hosts.names) and set(states.values()) == {"idle"}


def slurm_down(prefix: str) -> None:
    """Stop the daemons by PID file, kill everything left in the namespaces (job steps, ranks), delete the
    namespaces, /tmp/PREFIX-slurm and /etc/netns/PREFIX0, PREFIX1. Safe to call when nothing is up."""
    root = slurm_dir(prefix)
    remove_daemon_rig(prefix, root, [root / f"{name}.pid" for name in DAEMONS])


def slurm_cluster(prefix: str, subnet: int, timeout: float = 30) -> AbstractContextManager[SlurmCluster]:
    """The cluster for the body; always removed on exit, also when the body fails or times out."""
    return rig_session(lambda: slurm_up(prefix, subnet, timeout), lambda: slurm_down(prefix))


def job_id(sbatch_output: str) -> int | None:
    match = re.search(r"Submitted batch job (\d+)", sbatch_output)
    return int(match.group(1)) if match else None

"""Root-only test and benchmark rigs: two hosts in network namespaces (netns), a real two-node Slurm cluster
(slurm), and two sshd hosts for DeepSpeed's pdsh launcher (pdsh). Not part of the installed library.

    python -m tests.rigs slurm up zkx --subnet 60      # ... and `slurm down zkx`; also `ssh`, `netns`, `apt`
"""

from tests.rigs.base import APT_PACKAGES, RigError, apt_line, apt_packages, private_extensions_dir, require
from tests.rigs.netns import TwoHosts, reachable, remove_hosts, set_link, set_rate, two_hosts
from tests.rigs.pdsh import SshHosts, ssh_down, ssh_hosts, ssh_up, write_deepspeed_env, write_hostfile
from tests.rigs.slurm import SlurmCluster, slurm_cluster, slurm_down, slurm_up

__all__ = [
    "APT_PACKAGES",
    "private_extensions_dir",
    "RigError",
    "SlurmCluster",
    "SshHosts",
    "TwoHosts",
    "apt_line",
    "apt_packages",
    "reachable",
    "remove_hosts",
    "require",
    "set_link",
    "set_rate",
    "slurm_cluster",
    "slurm_down",
    "slurm_up",
    "ssh_down",
    "ssh_hosts",
    "ssh_up",
    "two_hosts",
    "write_deepspeed_env",
    "write_hostfile",
]

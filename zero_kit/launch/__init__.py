"""Starting ranks, in one place: where they go (Placement), the processes that start them (launch_commands: the
deepspeed and torchrun argv, hostfiles, srun), the one supervisor (signals, first failure, timeout, the stall
report) and the material `zero-kit launch` prints (sbatch scripts, hostfiles). Rendezvous ports: zero_kit.dist."""

from zero_kit.launch.argv import deepspeed_command, deepspeed_launcher, torchrun_command
from zero_kit.launch.hostfile import (
    ENV_FILE,
    RANK_ENV_PREFIXES,
    hostfile_text,
    parse_hostfile,
    rank_env,
    read_hostfile,
    write_rank_env,
)
from zero_kit.launch.placement import (
    Launch,
    Launcher,
    Placement,
    from_hostfile,
    launch_commands,
    local,
    per_node,
    slurm_allocation,
)
from zero_kit.launch.secrets import is_secret, redact, redact_argv, redact_env, write_private
from zero_kit.launch.slurm import (
    SLURM_DEFAULTS,
    SlurmJob,
    add_slurm_arguments,
    bench_sbatch_script,
    in_slurm_allocation,
    node_launcher_line,
    sbatch_script,
    slurm_nodes,
    srun_command,
)
from zero_kit.launch.supervisor import EXIT_TIMED_OUT, Outcome, Output, supervise

__all__ = [
    "ENV_FILE",
    "EXIT_TIMED_OUT",
    "RANK_ENV_PREFIXES",
    "SLURM_DEFAULTS",
    "Launch",
    "Launcher",
    "Outcome",
    "Output",
    "Placement",
    "SlurmJob",
    "add_slurm_arguments",
    "bench_sbatch_script",
    "deepspeed_command",
    "deepspeed_launcher",
    "from_hostfile",
    "hostfile_text",
    "in_slurm_allocation",
    "is_secret",
    "launch_commands",
    "local",
    "node_launcher_line",
    "parse_hostfile",
    "per_node",
    "rank_env",
    "read_hostfile",
    "redact",
    "redact_argv",
    "redact_env",
    "sbatch_script",
    "slurm_allocation",
    "slurm_nodes",
    "srun_command",
    "supervise",
    "torchrun_command",
    "write_private",
    "write_rank_env",
]

"""zero_kit.launch: the processes one (module, args, placement, launcher) becomes, for every kind of placement, and
the one hostfile reader's errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from zero_kit.errors import UserError
from zero_kit.launch import Launcher, Placement, from_hostfile, launch_commands, local, per_node, read_hostfile

DS, TORCHRUN = Launcher("deepspeed"), Launcher("torchrun")


def _hostfile(tmp_path: Path, text: str = "node1 slots=2\nnode2 slots=2\n") -> str:
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


def test_local_deepspeed_and_torchrun_start_one_launcher_here():
    ds = launch_commands("m", ["--a"], local(4), DS, port=29600)
    assert ds.argvs == [[str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "4", "--master_port", "29600",
                         "--module", "m", "--a"]]  # fmt: skip
    assert ds.env == {"OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // 4))} and ds.files == {}
    tr = launch_commands("m", [], local(4, ranks_per_node=2), TORCHRUN, port=29601)
    assert tr.argvs[0][:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert tr.argvs[0][tr.argvs[0].index("--nproc_per_node") + 1] == "4"
    assert local(4, 2).describe() == {"mode": "local", "nodes": 2, "ranks_per_node": 2}


def test_train_runner_with_a_users_hostfile_caps_ranks_and_ships_the_environment(tmp_path):
    runner = Launcher("deepspeed", program=("py", "-m", "deepspeed.launcher.runner"), no_local_rank=True)
    hostfile = _hostfile(tmp_path)
    launch = launch_commands("zero_kit.cli", ["train"], from_hostfile(hostfile, 1), runner, port=29500,
                             run_dir=tmp_path / "out", environ={"ZERO_KIT_X": "1", "GLOO_SOCKET_IFNAME": "eth0"})  # fmt: skip
    assert launch.argvs == [["py", "-m", "deepspeed.launcher.runner", "--hostfile", hostfile, "--num_gpus", "1",
                             "--master_port", "29500", "--no_local_rank", "--module", "zero_kit.cli", "train"]]  # fmt: skip
    env_file = tmp_path / "out" / ".deepspeed_env"
    assert launch.env == {"DS_ENV_FILE": str(env_file)}
    assert "ZERO_KIT_X=1\n" in launch.files[env_file] and "GLOO_SOCKET_IFNAME" not in launch.files[env_file]
    launch.write_files()
    assert env_file.is_file()


def test_bench_hostfile_writes_its_own_hostfile_for_deepspeed_and_ssh_starts_torchrun(tmp_path):
    where = Placement("hostfile", ("node1", "node2"), 2)
    ds = launch_commands("m", [], where, DS, port=29700, run_dir=tmp_path / "run")
    assert ds.files[tmp_path / "run" / "hostfile"] == "node1 slots=2\nnode2 slots=2\n"
    assert ds.argvs[0][1:7] == ["--hostfile", str(tmp_path / "run" / "hostfile"), "--master_addr", "node1",
                                "--master_port", "29700"]  # fmt: skip
    tr = launch_commands("m", [], where, TORCHRUN, port=29701, run_dir=tmp_path / "run")
    assert [argv[:5] for argv in tr.argvs] == [
        ["ssh", "-tt", "-o", "BatchMode=yes", host] for host in ("node1", "node2")
    ]
    assert "--node_rank 1" in tr.argvs[1][5] and tr.files == {}


def test_slurm_allocation_is_one_srun_with_the_rendezvous_in_its_environment(tmp_path):
    where = Placement("slurm", ("a", "b"), 4)
    launch = launch_commands("m", ["--x"], where, TORCHRUN, port=29702, run_dir=tmp_path)
    (srun,) = launch.argvs
    assert srun[:3] == ["srun", "--nodes=2", "--ntasks-per-node=1"] and srun[-2:] == ["node", "--x"]
    assert "--nproc_per_node 4" in srun[5] and '--node_rank "$SLURM_NODEID"' in srun[5]
    assert launch.env == {"MASTER_ADDR": "a", "MASTER_PORT": "29702", "HOSTFILE": str(tmp_path / "hostfile")}


def test_per_node_prefixes_start_one_launcher_per_node(tmp_path):
    """The namespace rig: `ip netns exec hostN` before each node's own launcher."""
    prefixes = [("ip", "netns", "exec", f"h{n}") for n in (0, 1)]
    where = per_node([("10.0.0.1", 2), ("10.0.0.2", 2)], prefixes)
    ds = launch_commands("m", [], where, DS, port=29703, run_dir=tmp_path)
    for node, argv in enumerate(ds.argvs):
        assert argv[:4] == list(prefixes[node])
        assert argv[argv.index("--node_rank") + 1] == str(node) and "--no_ssh" in argv
        assert argv[argv.index("--master_addr") + 1] == "10.0.0.1"
    assert ds.files[tmp_path / "hostfile"] == "10.0.0.1 slots=2\n10.0.0.2 slots=2\n"
    uneven = per_node([("a", 2), ("b", 3)])
    tr = launch_commands("m", [], uneven, Launcher("torchrun", program=("python",)), port=29704, master_addr="x")
    assert [argv[argv.index("--nproc_per_node") + 1] for argv in tr.argvs] == ["2", "3"]
    assert all(argv[0] == "python" and argv[argv.index("--master_addr") + 1] == "x" for argv in tr.argvs)


def test_hostfile_reader_names_file_and_line_and_a_missing_file(tmp_path):
    bad = _hostfile(tmp_path, "node1 slots=2\n\nnode2 slots=0\nnode 3\n")
    with pytest.raises(UserError) as err:
        read_hostfile(bad)
    assert f"{bad}:3" in str(err.value) and f"{bad}:4" in str(err.value) and f"{bad}:1" not in str(err.value)
    with pytest.raises(UserError, match="--hostfile .*missing: cannot read it"):
        read_hostfile(str(tmp_path / "missing"))
    with pytest.raises(UserError, match="lists no hosts"):
        read_hostfile(_hostfile(tmp_path, "# only a comment\n"))


def test_bench_places_a_hostfile_with_even_slots_only(tmp_path):
    from zero_kit.bench import BenchOptions
    from zero_kit.bench.placement import place

    opts = BenchOptions(hostfile=_hostfile(tmp_path), gpus_per_node=1)
    assert place(opts, {}) == Placement("hostfile", ("node1", "node2"), 1)
    assert place(BenchOptions(nproc=4, gpus_per_node=2), {}).describe() == {"mode": "local", "nodes": 2,
                                                                             "ranks_per_node": 2}  # fmt: skip
    with pytest.raises(UserError, match="different slots"):
        place(BenchOptions(hostfile=_hostfile(tmp_path, "a slots=1\nb slots=2\n")), {})

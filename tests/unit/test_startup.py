"""Start-up (issue 23): the stage clock's arithmetic and record, threads per rank (cores / local ranks unless the
user set OMP_NUM_THREADS) where ranks start and where zero-kit starts them, and input mistakes reported by the CLI
before any heavy import. The ranks' side of both runs in tests/dist/test_startup_train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zero_kit.dist import THREADS_ENV, rank_threads, set_rank_threads
from zero_kit.errors import UserError
from zero_kit.launch import Launcher, from_hostfile, launch_commands, local
from zero_kit.train.guards.inputs import check_inputs
from zero_kit.train.options import TrainOptions
from zero_kit.train.startup import STAGES, STARTUP_FILE, StartupClock, milestones


def _clock(times: list[float]) -> StartupClock:
    """A clock whose command started at 100.0 and whose process started at 103.0; stages end at `times`."""
    clock = StartupClock(command=100.0, process=103.0)
    for stage, at in zip(STAGES[2:], times, strict=False):
        clock.marks.append((stage, at))
        clock.rss[stage] = 2**20 * len(clock.marks)
    return clock


def test_each_stage_runs_from_the_end_of_the_one_before():
    clock = _clock([110.0, 112.5, 113.0, 120.0, 125.0, 126.0])
    assert clock.stages() == {
        "launch": 3.0,
        "imports": 7.0,
        "rendezvous": 2.5,
        "model": 0.5,
        "data": 7.0,
        "engine": 5.0,
        "first_step": 1.0,
    }
    record = clock.record()
    assert record["time_to_first_step_s"] == 26.0
    assert record["rss_mib_after"]["data"] == 5.0
    assert record["peak_rss_mib"] > 0
    assert clock.line().startswith("zero-kit train: time to first step 26.0 s (launch 3.0 s, imports 7.0 s,")


def test_each_mark_records_resident_and_private_memory():
    """Private (anonymous) bytes apart from the resident total: the rest is shared file pages (libraries, the
    memory-mapped data), one copy on the host for every rank."""
    clock = StartupClock(command=100.0, process=100.0, memory=True)
    clock.mark("imports")
    record = clock.record()
    assert 0 < record["private_mib_after"]["imports"] < record["rss_mib_after"]["imports"]
    quiet = StartupClock(command=100.0, process=100.0)  # off the product path unless a study asks (MEMORY_ENV)
    quiet.mark("imports")
    assert quiet.record()["rss_mib_after"] == {} and quiet.record()["peak_rss_mib"] > 0


def test_a_relaunchs_ranks_continue_the_parents_clock(monkeypatch):
    parent = StartupClock(command=100.0, process=100.0)
    parent.marks.append(("prepare", 104.5))  # the parent prepared the data before starting the launcher
    for name, value in parent.for_ranks().items():
        monkeypatch.setenv(name, value)
    rank = StartupClock()  # this process started after the parent's prepare mark
    rank.mark("prepare")  # the rank's own (cached) prepare: already closed by the parent's mark
    rank.mark("imports")
    stages = rank.stages()
    assert list(stages) == ["prepare", "launch", "imports"]
    assert stages["prepare"] == 4.5 and stages["launch"] > 0


def test_without_a_relaunch_the_stages_come_in_the_order_they_happened():
    clock = StartupClock(command=100.0, process=100.0)
    clock.mark("prepare")
    clock.mark("imports")
    assert list(clock.stages()) == ["launch", "prepare", "imports"]


def test_a_launch_stage_under_clock_skew_is_zero_and_a_stage_closes_once():
    clock = StartupClock(command=104.0, process=103.0)  # hosts' clocks may disagree by a second
    clock.mark("imports")
    first = clock.marks[-1]
    clock.mark("imports")
    assert clock.marks[-1] == first and clock.done() == ["launch", "imports"]
    assert clock.stages()["launch"] == 0.0


def test_an_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="unknown start-up stage 'warmup'"):
        StartupClock(command=0.0, process=0.0).mark("warmup")


def test_milestones_close_the_stage_and_beat(tmp_path):
    beats = []
    clock = StartupClock(command=0.0, process=0.0)
    reached = milestones(clock, lambda: beats.append(1))
    reached("rendezvous")
    reached("model")
    assert clock.done() == ["launch", "rendezvous", "model"] and len(beats) == 2
    clock.finish(tmp_path)
    written = json.loads((tmp_path / STARTUP_FILE).read_text())
    assert list(written["stages_s"]) == ["launch", "rendezvous", "model"]
    assert written["threads"]["OMP_NUM_THREADS"] == os.environ.get(THREADS_ENV)


@pytest.mark.parametrize(
    ("environ", "cores", "threads"),
    [
        ({"LOCAL_WORLD_SIZE": "2"}, 2, 1),  # torchrun's variable
        ({"LOCAL_SIZE": "8"}, 16, 2),  # the deepspeed launcher's
        ({"LOCAL_SIZE": "4"}, 2, 1),  # more ranks than cores: one each, never zero
        ({}, 6, 6),  # one process alone
    ],
)
def test_threads_are_the_cores_shared_by_the_local_ranks(environ, cores, threads):
    assert rank_threads(environ, cores) == threads


def test_a_users_omp_num_threads_wins_and_is_left_alone(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert set_rank_threads() is None
    assert os.environ[THREADS_ENV] == "3"


def test_unset_omp_num_threads_is_set_for_this_rank(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "")  # empty reads as unset; setenv (not delenv) puts the original back after
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_SIZE", "")
    expected = len(os.sched_getaffinity(0))
    assert set_rank_threads() == expected
    assert os.environ[THREADS_ENV] == str(expected)


def test_local_launches_carry_the_threads_and_hostfile_launches_leave_them_to_each_host(tmp_path):
    cores = len(os.sched_getaffinity(0))
    launcher = Launcher("torchrun")
    plain = launch_commands("m", [], local(2), launcher, port=1, environ={})
    assert plain.env == {THREADS_ENV: str(max(1, cores // 2))}
    users = launch_commands("m", [], local(2), launcher, port=1, environ={THREADS_ENV: "5"})
    assert THREADS_ENV not in users.env  # the user's own value reaches the ranks untouched
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("hostA slots=2\nhostB slots=2\n")
    remote = launch_commands("m", [], from_hostfile(str(hostfile)), launcher, port=1, run_dir=tmp_path, environ={})
    assert THREADS_ENV not in remote.env


def test_unwritable_output_and_missing_nvme_path_are_input_mistakes(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    opts = TrainOptions(output=str(blocker / "run"), stage=3, offload_param="nvme", offload_optimizer="cpu",
                        nvme_path=str(tmp_path / "no-nvme"))  # fmt: skip
    with pytest.raises(UserError) as err:
        check_inputs(opts)
    assert err.value.message.startswith("2 problems in the inputs of zero-kit train")
    assert f"--output {blocker / 'run'}: {blocker} is a file" in err.value.message
    assert f"--nvme-path {tmp_path / 'no-nvme'}: does not exist" in err.value.message


CLI = """
import sys
from zero_kit.cli import main
codes = [main(["train", "--model", "/nonexistent-model"]), main(["train", "--output", "/proc/zero-kit-run"])]
print(codes, sorted(m for m in ("torch", "transformers", "deepspeed", "accelerate") if m in sys.modules))
"""


def test_a_wrong_model_or_output_is_reported_before_any_heavy_import(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", CLI], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": root}, cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.stdout.strip() == "[2, 2] []", proc.stdout + proc.stderr  # exit 2 each; no heavy library imported
    assert proc.stderr.splitlines() == [  # the error and the fix, and no library's warning around them
        "zero-kit train: error: --model /nonexistent-model: no such directory",
        "  fix: pass a local Hugging Face model directory",
        "zero-kit train: error: --output /proc/zero-kit-run: cannot write in /proc (No such file or directory)",
        "  fix: choose a writable --output",
    ]


def _rank_probe(
    env: dict[str, str], torch_first: bool = False, stage: int = 2, params: int = 27_565_568
) -> tuple[bool, int]:
    """A fresh rank-like process: (did set_rank_huge_pages set the variable, AnonHugePages KiB after a 64 MiB CPU
    tensor is written)."""
    import subprocess
    import sys

    code = ("import torch\n" if torch_first else "") + (
        f"from zero_kit.dist import set_rank_huge_pages\nset_ = set_rank_huge_pages({stage}, {params})\nimport torch\n"
        "t = torch.ones(16 << 20)\n"  # 64 MiB of fp32, written
        "kib = next(line.split()[1] for line in open('/proc/self/smaps_rollup') if line.startswith('AnonHugePages'))\n"
        "print(set_, kib)"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("THP_MEM_ALLOC_ENABLE", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True)
    was_set, kib = out.stdout.split()
    return was_set == "True", int(kib)


def test_zero12_cpu_ranks_put_tensors_in_huge_pages_as_torch_and_the_kernel_do():
    """The real torch and kernel: THP_MEM_ALLOC_ENABLE set before torch's import gives a large CPU tensor huge pages
    where the kernel's THP is "madvise" (this machine's, a common default). ZeRO-3 ranks and a model whose gather
    glibc's heap reuses (under 32 MiB: the 3.1M bench model) keep 4 KiB pages; the user's 0 wins; after torch's
    import it is too late and nothing is set. A GPU host sets nothing."""
    from zero_kit.dist import gpu_host

    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().split("[")[1].split("]")[0]
    ours, zero3, small = _rank_probe({}), _rank_probe({}, stage=3), _rank_probe({}, params=3_148_224)
    theirs, late = _rank_probe({"THP_MEM_ALLOC_ENABLE": "0"}), _rank_probe({}, torch_first=True)
    assert (ours[0], zero3[0], small[0], theirs[0], late[0]) == (not gpu_host(), False, False, False, False)
    if mode == "madvise" and not gpu_host():
        assert ours[1] > 0 and zero3[1] == small[1] == theirs[1] == late[1] == 0, (ours, zero3, small, theirs, late)
    elif mode == "never":
        assert ours[1] == 0


def test_the_models_size_is_read_before_torch(tmp_path):
    from zero_kit.model import tiny_llama_config
    from zero_kit.plan.shapes import local_model_params

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(tiny_llama_config().to_dict()))
    assert local_model_params(str(tmp_path / "m")) == 3_148_224  # the bench's default model, read without torch
    assert local_model_params(str(tmp_path)) is None and local_model_params(None) is None

"""zero_kit.train.guards.preflight: each resource problem is one UserError naming the path or option, the numbers and the fix.

Tests run as root in CI, so "not writable" is made with things root cannot get past either: a file where a
directory should be, and a directory under a file; "disk full" and "little RAM" patch what the OS reports.
"""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from zero_kit.errors import UserError
from zero_kit.train.guards import preflight
from zero_kit.train.options import TrainOptions
from zero_kit.train.plan import model_shape, nvme_dirs, planner_view, workload_of

Usage = namedtuple("Usage", "total used free")
VMem = namedtuple("VMem", "total available")


def _options(tmp_path: Path, **changes) -> TrainOptions:
    return TrainOptions(output=str(tmp_path / "out"), **changes)


def _check(opts: TrainOptions, ds_config: dict | None = None, *, local_ranks: int = 2) -> None:
    """Preflight of a run of `opts` on one node of `local_ranks` CPU ranks whose DeepSpeed dict is `ds_config`."""
    config = ds_config or {"zero_optimization": {"stage": 3}}
    stage = config.get("zero_optimization", {}).get("stage", 0)
    view = planner_view(config, workload_of(opts, "fp32"), stage, local_ranks, 1)
    preflight.run_preflight(Path(opts.output), view, nvme_dirs(config, from_file=opts.ds_config is not None))


def test_a_healthy_setup_passes_and_leaves_no_probe_file(tmp_path):
    _check(_options(tmp_path))
    assert (tmp_path / "out").is_dir()
    assert list((tmp_path / "out").iterdir()) == []


def test_output_that_is_a_file(tmp_path):
    (tmp_path / "out").write_text("not a directory")
    with pytest.raises(UserError) as err:
        _check(_options(tmp_path))
    assert "--output" in err.value.message and str(tmp_path / "out") in err.value.message
    assert "not a directory" in err.value.message and err.value.fix


def test_output_under_a_file_cannot_be_created(tmp_path):
    (tmp_path / "blocker").write_text("x")
    opts = TrainOptions(output=str(tmp_path / "blocker" / "run"))
    with pytest.raises(UserError) as err:
        _check(opts)
    assert "--output" in err.value.message and "cannot create it" in err.value.message
    assert str(tmp_path / "blocker") in err.value.message


def test_output_not_writable(tmp_path, monkeypatch):
    # What a read-only mount answers (root bypasses permission bits, not EROFS).
    def read_only(self, data):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "write_bytes", read_only)
    with pytest.raises(UserError) as err:
        _check(_options(tmp_path))
    assert "not writable (Read-only file system)" in err.value.message and "--output" in err.value.message


def test_disk_too_full_for_a_checkpoint_names_both_sizes(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(UserError) as err:
        _check(_options(tmp_path))
    need, _ = preflight.checkpoint_bytes(model_shape(TrainOptions()).n_params, "fp32")
    message = err.value.message
    assert "0.00 GiB free" in message and f"{need / 2**30:.2f} GiB" in message and "Ψ = " in message
    assert "free" in err.value.fix and "--output" in err.value.fix


def test_checkpoint_estimate_is_weights_plus_master_and_adam():
    need, formula = preflight.checkpoint_bytes(1000, "fp32")
    # fp32 weights 4 + fp32 master 4 + Adam moments 8 per parameter, at least: what DeepSpeed writes.
    assert need >= 16 * 1000 and "Ψ" in formula
    lora_need, _ = preflight.checkpoint_bytes(1000, "fp32", trainable_params=10)
    assert lora_need < need


def test_nvme_path_missing(tmp_path):
    config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": str(tmp_path / "nv")}}}
    with pytest.raises(UserError) as err:
        _check(_options(tmp_path, stage=3, offload_param="nvme", nvme_path=str(tmp_path / "nv")), config)
    assert err.value.message.startswith(f"--nvme-path {tmp_path / 'nv'}: does not exist")
    assert "mkdir -p" in err.value.fix


def test_nvme_path_from_a_config_file_names_the_key(tmp_path):
    (tmp_path / "nv").write_text("a file")
    config = {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "nv")}}
    }
    with pytest.raises(UserError) as err:
        _check(_options(tmp_path, ds_config="x.json"), config)
    assert (
        "zero_optimization.offload_optimizer.nvme_path" in err.value.message and "not a directory" in err.value.message
    )


def test_host_ram_too_small_for_cpu_offload(tmp_path, monkeypatch):
    import psutil

    monkeypatch.delenv(preflight.HOST_MEM_ENV, raising=False)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: VMem(2**30, 2**30))
    config = {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    }
    with pytest.raises(UserError) as err:
        _check(_options(tmp_path), config, local_ranks=2)
    message = err.value.message
    assert "host RAM 1.00 GiB <" in message and "2 rank(s)" in message and "zero3, optimizer+param" in message
    assert "baseline per rank" in message and "nvme" in err.value.fix


def test_host_ram_check_only_applies_to_cpu_offload(tmp_path, monkeypatch):
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: VMem(2**20, 2**20))
    _check(_options(tmp_path), {"zero_optimization": {"stage": 3}})


def test_host_ram_override_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(preflight.HOST_MEM_ENV, str(64 * 2**30))
    assert preflight.host_mem_bytes() == 64 * 2**30
    monkeypatch.setenv(preflight.HOST_MEM_ENV, "lots")
    with pytest.raises(UserError, match=preflight.HOST_MEM_ENV):
        preflight.host_mem_bytes()


def test_every_problem_is_reported_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(preflight.HOST_MEM_ENV, "1000")
    (tmp_path / "out").write_text("x")
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    with pytest.raises(UserError) as err:
        _check(_options(tmp_path), config)
    assert err.value.message.startswith("2 problems before training:")
    assert "--output" in err.value.message and "host RAM" in err.value.message


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_disk_errors_during_training_become_one_line(tmp_path, code):
    # more: tests/unit/test_refused_first.py (case 9)
    error, _ = preflight.disk_full_error(OSError(code, "boom", str(tmp_path / "checkpoint-4" / "x.pt")), tmp_path, 1, 4)
    assert f"--output {tmp_path}" in error.message and "--resume auto" not in error.fix  # nothing complete yet
    assert error.exit_code == preflight.EXIT_DISK_FULL


def test_other_os_errors_pass_through(tmp_path):
    assert preflight.disk_full_error(FileNotFoundError(errno.ENOENT, "gone"), tmp_path, 1, 4) is None


def test_room_for_what_save_total_limit_keeps(tmp_path, monkeypatch):
    need, _ = preflight.checkpoint_bytes(model_shape(TrainOptions()).n_params, "fp32")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, int(2.5 * need)))
    opts = _options(tmp_path)
    view = planner_view({"zero_optimization": {"stage": 2}}, workload_of(opts, "fp32"), 2, 1, 1)
    preflight.run_preflight(tmp_path / "out", view, checkpoints=2)
    with pytest.raises(UserError, match="3 more checkpoints at once need about"):
        preflight.run_preflight(tmp_path / "out", view, checkpoints=3)


def test_enough_host_ram_for_cpu_offload_passes(tmp_path, monkeypatch):
    monkeypatch.setenv(preflight.HOST_MEM_ENV, str(16 * 2**30))
    config = {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    }
    _check(_options(tmp_path), config, local_ranks=2)
    # 2 ranks x (2 GiB baseline + offloaded fp32 states): just over 4 GiB refuses, for a model of 3M parameters.
    monkeypatch.setenv(preflight.HOST_MEM_ENV, str(4 * 2**30))
    with pytest.raises(UserError, match="host RAM 4.00 GiB < about 4.0"):
        _check(_options(tmp_path), config, local_ranks=2)


def test_host_ram_estimate_uses_the_planners_assumptions(tmp_path, monkeypatch):
    """Preflight's host baseline is the planner's stated one (Assumptions.host_baseline_gib), not its own copy."""
    import dataclasses

    from zero_kit.plan.assumptions import Assumptions

    monkeypatch.setenv(preflight.HOST_MEM_ENV, str(4 * 2**30))
    config = {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    }
    view = planner_view(config, workload_of(_options(tmp_path), "fp32"), 3, 2, 1)
    assert view.assume == Assumptions()
    with pytest.raises(UserError, match=r"baseline per rank 4.00 GiB \(2 x 2 GiB\)"):
        preflight.run_preflight(tmp_path / "out", view)
    preflight.run_preflight(tmp_path / "out", dataclasses.replace(view, assume=Assumptions(host_baseline_gib=1.0)))

"""zero_kit.checkpoints.universal without a process group: which world size wrote a checkpoint, when a conversion is
needed, and that a failed conversion is a UserError that leaves nothing half-written behind. The real
conversion and the resume at 1 and 4 ranks run in tests/dist/test_reliability.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from zero_kit.checkpoints import store, universal
from zero_kit.errors import UserError


def _checkpoint(tmp_path: Path, *, manifest_ws: int | None = None, run_ws: int | None = None, shards: int = 2) -> Path:
    ck = tmp_path / "checkpoint-4"
    (ck / "global_step4").mkdir(parents=True)
    (ck / "latest").write_text("global_step4")
    for rank in range(shards):
        (ck / "global_step4" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"not a real shard")
    if manifest_ws is not None:
        (ck / store.MANIFEST).write_text(json.dumps({"step": 4, "world_size": manifest_ws, "files": {}}))
    if run_ws is not None:
        (ck / store.RUN_INFO).write_text(json.dumps({"world_size": run_ws}))
    return ck


def test_world_size_from_the_manifest_first(tmp_path):
    assert universal.saved_world_size(_checkpoint(tmp_path, manifest_ws=2, run_ws=8, shards=3)) == 2


def test_world_size_from_the_run_record(tmp_path):
    assert universal.saved_world_size(_checkpoint(tmp_path, run_ws=8, shards=3)) == 8


def test_world_size_from_deepspeed_shards_alone(tmp_path):
    assert universal.saved_world_size(_checkpoint(tmp_path, shards=3)) == 3


def test_unknown_world_size(tmp_path):
    assert universal.saved_world_size(tmp_path) is None


def test_same_world_size_needs_no_conversion(tmp_path):
    ck = _checkpoint(tmp_path, manifest_ws=2)
    args = SimpleNamespace(world_size=2, process_index=0, hf_deepspeed_config=SimpleNamespace(config={}))
    assert universal.prepare_resume(ck, args) is False
    assert args.hf_deepspeed_config.config == {}
    assert universal.prepare_resume(None, args) is False


def test_failed_conversion_is_a_user_error_and_leaves_no_partial_output(tmp_path):
    ck = _checkpoint(tmp_path, manifest_ws=2)  # shards that are not torch files: DeepSpeed's tool fails
    args = SimpleNamespace(world_size=1, process_index=0, hf_deepspeed_config=SimpleNamespace(config={}))
    with pytest.raises(UserError) as err:
        universal.prepare_resume(ck, args)
    assert "universal checkpoint conversion failed" in err.value.message and "2 ranks" in err.value.fix
    assert not universal.universal_ready(ck)
    assert sorted(p.name for p in ck.iterdir()) == ["global_step4", "latest", store.MANIFEST]
    assert "load_universal" not in json.dumps(args.hf_deepspeed_config.config)


def test_ready_only_when_the_pointer_names_a_converted_directory(tmp_path):
    ck = _checkpoint(tmp_path, manifest_ws=2)
    (ck / universal.LATEST_UNIVERSAL).write_text("global_step4_universal")
    assert not universal.universal_ready(ck)  # pointer written, directory missing: redo the conversion
    (ck / "global_step4_universal" / "zero").mkdir(parents=True)
    assert universal.universal_ready(ck)
    assert universal.convert(ck) == ck / "global_step4_universal"  # idempotent: nothing is redone

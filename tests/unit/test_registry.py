"""The strategy registry (zero_kit.strategies) is the only source of strategy names and their facts: the planner's
options, the benchmark's launcher and DeepSpeed overrides, the report's byte-table mapping and the stage `plan -o`
writes all resolve through it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zero_kit.bench.report import model_parallel_layout, predicted_state
from zero_kit.errors import UserError
from zero_kit.plan import KNOWN_SHAPES, Hardware, StateBytes, Workload, make_plan, model_state_bytes
from zero_kit.plan.accounting import ROWS
from zero_kit.plan.parallel import parallel_state_bytes
from zero_kit.strategies import STRATEGIES, check_name, sequence_parallel_name, strategy_info

PACKAGE = Path(__file__).resolve().parents[2] / "zero_kit"
BENCHABLE = [name for name, info in STRATEGIES.items() if info.benchable]


def test_plan_options_are_the_planned_registry_entries_in_order():
    plan = make_plan(Workload(KNOWN_SHAPES["llama-3-8b"], KNOWN_SHAPES["llama-3-8b"].n_params), Hardware(80 * 10**9, 8))
    planned = [info for info in STRATEGIES.values() if info.planned]
    flat = [o for o in plan.options if o.layout is None]  # then the tensor/pipeline layouts (plan.parallel_options)
    assert plan.options[: len(flat)] == flat and [o.label for o in plan.options[len(flat) :]] == ["zero1+tp8"]
    assert [o.info for o in flat] == planned
    assert [o.info.name for o in flat] == [
        "ddp", "fsdp", "fsdp_hsdp", "fsdp_reshard_node", "zero0", "zero1", "zero2", "zero3", "zero3_hpz",
        "zero3_bf16states", "zero2_offload", "zero3_offload", "zero3_offload_param",
    ]  # fmt: skip
    for option in plan.options:
        info = STRATEGIES[option.info.name]
        assert option.strategy == info.accounting
        assert (option.offload != "none") == info.offload_optimizer
        assert ("param" in option.offload) == info.offload_param
    assert len({o.label for o in plan.options}) == len(plan.options)


def test_every_entry_names_a_byte_table_row_and_every_row_is_used():
    assert {info.accounting for info in STRATEGIES.values()} == set(ROWS)
    for name, info in STRATEGIES.items():
        assert info.name == name
        assert model_state_bytes(
            info.accounting, 1000, 2, "bf16", offload_optimizer=info.offload_optimizer, offload_param=info.offload_param
        ).all_bytes
        if info.backend == "deepspeed":
            bf16 = "_bf16" if info.low_precision_states else ""
            assert info.accounting == f"zero{info.stage}{bf16}" and info.launcher == "deepspeed"
        elif info.backend == "pipeline":  # each stage is a plain replica of its layers
            assert info.accounting == "ddp" and info.launcher == "torchrun" and info.pipeline_stages > 1
        else:
            assert info.backend == info.accounting and info.launcher == "torchrun" and not info.zero_overrides


@pytest.mark.parametrize("name", BENCHABLE)
def test_bench_names_resolve_and_the_report_predicts_through_the_registry(name):
    info = check_name(name)
    assert info is STRATEGIES[name]
    record = {"strategy": name, "world_size": 2, "precision": "bf16", "model": {"n_params": 10_000}}
    if info.model_parallel > 1:  # the planner's layout: the row over each rank's slice, sharded over dp ranks
        shape = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 100, "seq_len": 16}
        record.update(world_size=2 * info.model_parallel, model={"n_params": 10_000, **shape},
                      batch={"micro": 1, "grad_accum": 1})  # fmt: skip
        layout, work = model_parallel_layout(info, record)
        states = parallel_state_bytes(work, layout, record["world_size"])
        assert layout.dp(record["world_size"]) == 2 and (layout.tp, layout.pp) == (
            info.tensor_parallel,
            info.pipeline_stages,
        )
    else:
        states = model_state_bytes(info.accounting, 10_000, 2, "bf16", offload_optimizer=info.offload_optimizer)
    assert predicted_state(record)["total"] == states.all_bytes


def test_the_bench_refuses_what_its_backends_cannot_run():
    with pytest.raises(UserError, match="benchmark cannot run"):
        check_name("zero3_offload_param")
    with pytest.raises(UserError, match="unknown strategy") as refused:
        check_name("zero4")
    assert "zero3_offload_param" not in refused.value.fix and all(n in refused.value.fix for n in BENCHABLE)


def test_no_consumer_spells_a_variant_name():
    # config/presets.py names preset files (ds_configs/zero3_offload.json offloads parameters too): another namespace.
    variants = [name for name in STRATEGIES if "_" in name]
    registry = PACKAGE / "strategies" / "__init__.py"
    consumers = ("bench", "plan", "commands", "strategies", "train")
    for path in (p for folder in consumers for p in (PACKAGE / folder).rglob("*.py")):
        if path != registry:
            text = path.read_text(encoding="utf-8")
            assert not [name for name in variants if f'"{name}"' in text], path


def test_the_registry_and_the_planner_import_neither_torch_nor_deepspeed():
    code = "import sys, zero_kit.strategies, zero_kit.plan; print(sorted({'torch', 'deepspeed'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == []


def test_state_bytes_as_dict_is_the_record_shape():
    assert StateBytes(1, 2, 3).as_dict() == {"params": 1, "grads": 2, "optimizer": 3, "total": 6}
    offloaded = model_state_bytes("zero3", 1000, 2, "bf16", offload_optimizer=True, offload_param=True).as_dict()
    assert offloaded["total"] == 0 and offloaded["host_total"] > 0


def test_a_zero_entry_runs_under_sequence_parallelism_as_its_sp_variant():
    # zero3_sp2 is zero3 with Ulysses groups of 2 ranks per row: the same stage, launcher and byte-table row (ZeRO
    # partitions over every rank), predicted as zero3 is, never a planner option.
    info = check_name("zero3_sp2")
    assert (info.name, info.sequence_parallel, info.planned) == ("zero3_sp2", 2, False)
    assert (info.stage, info.launcher, info.accounting) == (3, "deepspeed", "zero3")
    assert strategy_info("zero3_release_sp4").zero_overrides == STRATEGIES["zero3_release"].zero_overrides
    record = {"strategy": "zero3_sp2", "world_size": 2, "precision": "fp32", "model": {"n_params": 10_000}}
    assert predicted_state(record)["total"] == model_state_bytes("zero3", 10_000, 2, "fp32").all_bytes
    able = [name for name, entry in STRATEGIES.items() if sequence_parallel_name(entry, 2)]
    assert "zero2" in able and "zero3_offload" in able
    assert not {"ddp", "fsdp", "zero1_tp", "pp", "zero3_hpz", "zero3_offload_param"} & set(able)


@pytest.mark.parametrize(
    "name, says",
    [("ddp_sp2", "ddp has no sequence-parallel variant"), ("zero1_tp_sp2", "zero1_tp has no sequence-parallel"),
     ("zero3_sp1", "N of 2 or more"), ("zero3_sp02", "no sequence-parallel variant"),
     ("zero3_sp2_sp2", "no sequence-parallel variant"), ("zero4_sp2", "unknown strategy 'zero4'")],
)  # fmt: skip
def test_a_sequence_parallel_name_the_registry_cannot_run_is_refused_with_the_choices(name, says):
    with pytest.raises(UserError, match=says) as refused:
        check_name(name)
    assert strategy_info(name) is None
    if "zero4'" not in says:
        assert "zero3_sp2" in refused.value.fix and "ddp," not in refused.value.fix


def test_bench_sp_adds_a_row_after_each_zero_strategy_and_refuses_a_list_without_one():
    from zero_kit.bench.options import BenchOptions, strategy_names

    assert strategy_names(BenchOptions(strategies="ddp,zero2,fsdp,zero3,pp")) == ["ddp", "zero2", "fsdp", "zero3", "pp"]
    runs = strategy_names(BenchOptions(strategies="ddp,zero2,fsdp,zero3,pp", sp=2))
    assert runs == ["ddp", "zero2", "zero2_sp2", "fsdp", "zero3", "zero3_sp2", "pp"]
    assert strategy_names(BenchOptions(strategies="zero3,zero3_sp4", sp=4)) == ["zero3", "zero3_sp4"]  # once
    with pytest.raises(UserError, match="'ddp,fsdp' has none") as refused:
        strategy_names(BenchOptions(strategies="ddp,fsdp", sp=2))
    assert "zero3" in refused.value.fix


def test_the_bench_refuses_a_sequence_parallel_run_ulysses_cannot_split_before_launching():
    from types import SimpleNamespace

    from zero_kit.bench.driver import check_sequence_parallel

    model = SimpleNamespace(num_attention_heads=6, num_key_value_heads=3)
    check_sequence_parallel([check_name("zero3_sp3"), STRATEGIES["ddp"]], 3, model, 96)  # 3 | 6 heads, 3 kv: fine
    with pytest.raises(UserError) as refused:
        check_sequence_parallel([check_name("zero2_sp4")], 6, model, 30)
    said = str(refused.value)
    assert "--sp 4 does not divide the world size 6 (--nproc)" in said and "or run on a multiple of 4 ranks" in said
    assert "cannot split 6 attention heads (3 key-value heads) over 4 ranks" in said
    assert "--seq-len 30 is not a multiple of 4" in said and "--seq-len 32" in said

"""The Ulysses sequence-parallelism rules (zero_kit/lint/rules_ulysses.py), each against the DeepSpeed or accelerate
code that refuses the case: UlyssesSPAttentionHF's head checks and UlyssesSPDataLoaderAdapter's length check run with a
stand-in for the process group (one rank that sees its own tensors as every rank's), DeepSpeed's eager refusal in
register_with_transformers, the engine's AutoEP check, and accelerate's own DeepSpeedSequenceParallelConfig. Each
fixed config gets no such problem, and a config without sequence_parallel_size, or with 1, gets none at all."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from zero_kit.lint import LintContext, check_rules, lint
from zero_kit.lint.accelerate_yaml import check_accelerate_yaml
from zero_kit.lint.rules_ulysses import accelerate_sp_rules, attention_problems

BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
GRADIENTS = "gradients of the HF Trainer's sequence-parallel loss"
HEADS = [(heads, kv) for heads in (4, 6, 8, 32) for kv in (1, 2, 3, 4, 8) if kv <= heads and heads % kv == 0]


def _sp_problems(config: dict, context: LintContext, gradients: bool = False) -> list:
    """The rules' problems at sequence_parallel_size; the ZeRO-0/1/2 gradient warning (DeepSpeed >= 0.19.6, BASE is
    ZeRO-2) only with `gradients`: it has a test of its own."""
    return [p for p in check_rules(config, context) if p.path == "sequence_parallel_size"
            and (gradients or GRADIENTS not in p.message)]  # fmt: skip


def _deepspeed_accepts_heads(monkeypatch, heads: int, kv: int, sp: int) -> bool:
    """DeepSpeed's own UlyssesSPAttentionHF.__init__ for a group of `sp` ranks (only its size and rank are asked)."""
    from deepspeed.runtime.sequence_parallel import ulysses_sp

    group = SimpleNamespace(get_world_size=lambda group=None: sp, get_rank=lambda group=None: 0)
    monkeypatch.setattr(ulysses_sp, "dist", group)
    monkeypatch.setattr(ulysses_sp, "register_all_to_all_group", lambda group: None)
    try:
        ulysses_sp.UlyssesSPAttentionHF(attn=None, batch_size=1, attn_head_count=heads, attn_head_size=8,
                                        kv_head_count=kv, num_hidden_layers=1, process_group=None,
                                        seq_length_is_variable=True)  # fmt: skip
    except ValueError as err:
        assert "head count" in str(err)
        return False
    return True


@pytest.mark.parametrize("sp", [2, 3, 4, 8])
def test_the_head_rules_refuse_exactly_what_ulysses_refuses(monkeypatch, sp):
    for heads, kv in HEADS:
        context = LintContext(world_size=sp, attention_heads=heads, kv_heads=kv)
        problems = _sp_problems({**BASE, "sequence_parallel_size": sp}, context)
        refused = [p for p in problems if p.severity == "error" and "heads" in p.message]
        assert (not refused) == _deepspeed_accepts_heads(monkeypatch, heads, kv, sp), (heads, kv, sp, problems)
        for problem in refused:  # the fix names a size that Ulysses takes, or none
            assert problem.value == sp and "sequence_parallel_size" in problem.fix
            if "set sequence_parallel_size to" in problem.fix:
                fixed = int(problem.fix.split(" to ")[1].split(",")[0])
                assert _deepspeed_accepts_heads(monkeypatch, heads, kv, fixed) and sp % fixed == 0
                assert not _sp_problems({**BASE, "sequence_parallel_size": fixed}, context)


def test_fewer_kv_heads_that_divide_sp_are_replicated_not_refused(monkeypatch):
    """Llama-3-8B's 32 heads and 8 kv heads at sp 16: DeepSpeed replicates each kv head twice."""
    context = LintContext(world_size=16, attention_heads=32, kv_heads=8)
    assert not _sp_problems({**BASE, "sequence_parallel_size": 16}, context)
    assert _deepspeed_accepts_heads(monkeypatch, 32, 8, 16)
    (problem,) = _sp_problems({**BASE, "sequence_parallel_size": 16}, LintContext(attention_heads=48, kv_heads=6))
    assert "key-value heads(6) neither divide sequence_parallel_size(16)" in problem.message
    assert problem.fix == "set sequence_parallel_size to 12, or leave it out"
    assert not _deepspeed_accepts_heads(monkeypatch, 48, 6, 16) and _deepspeed_accepts_heads(monkeypatch, 48, 6, 12)


def test_no_sequence_parallelism_no_new_problem():
    """Heads Ulysses would refuse, a node it would span, AutoEP at ZeRO-3: nothing without sequence parallelism."""
    context = LintContext(world_size=6, ranks_per_node=3, attention_heads=6, kv_heads=3)
    autoep = {**BASE, "zero_optimization": {"stage": 3}, "expert_parallel": {"enabled": True}}
    for config in (BASE, {**BASE, "sequence_parallel_size": 1}, autoep, {**autoep, "sequence_parallel_size": 1}):
        assert not _sp_problems(config, context), config
    assert lint({**BASE, "sequence_parallel_size": 1}, context) == lint(BASE, context)


def test_a_group_across_two_nodes_is_a_warning():
    config = {**BASE, "sequence_parallel_size": 2}
    (problem,) = _sp_problems(config, LintContext(world_size=6, ranks_per_node=3))
    assert problem.severity == "warning" and "does not divide the 3 ranks per node" in problem.message
    assert not _sp_problems(config, LintContext(world_size=8, ranks_per_node=4))
    assert not _sp_problems({**BASE, "sequence_parallel_size": 4}, LintContext(world_size=4, ranks_per_node=4))


def test_autoep_at_zero3_is_refused_as_the_engine_refuses_it():
    from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer
    from deepspeed.runtime.engine import DeepSpeedEngine

    def engine(sp: int) -> SimpleNamespace:
        config = SimpleNamespace(zero_config=SimpleNamespace(zero_hpz_partition_size=1),
                                 expert_parallel_config=SimpleNamespace(expert_tensor_parallel_size=1))  # fmt: skip
        layers = SimpleNamespace(named_modules=lambda: [("layers.0.mlp", object.__new__(AutoEPMoELayer))])
        return SimpleNamespace(has_moe_layers=True, module=layers, sequence_parallel_size=sp, _config=config,
                               zero_quantized_gradients=lambda: False)  # fmt: skip

    with pytest.raises(AssertionError, match="does not support sequence parallelism"):
        DeepSpeedEngine._validate_zero3_moe_compatibility(engine(2))
    DeepSpeedEngine._validate_zero3_moe_compatibility(engine(1))
    autoep = {**BASE, "expert_parallel": {"enabled": True}, "sequence_parallel_size": 2}
    (problem,) = _sp_problems({**autoep, "zero_optimization": {"stage": 3}}, LintContext(world_size=2))
    assert problem.severity == "error" and "AutoEP" in problem.message and "stage to 2" in problem.fix
    assert not _sp_problems(autoep, LintContext(world_size=2))  # fixed: ZeRO-2


def _deepspeed_splits(monkeypatch, length: int, sp: int) -> bool:
    """DeepSpeed's own UlyssesSPDataLoaderAdapter on one batch of `length` tokens (every rank's batch alike)."""
    import torch
    from deepspeed.runtime.sequence_parallel import ulysses_sp

    def all_gather(tensors, tensor, group=None):
        for each in tensors:
            each.copy_(tensor)

    monkeypatch.setattr(ulysses_sp, "dist", SimpleNamespace(all_gather=all_gather))
    ids = torch.arange(length).unsqueeze(0)
    batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": ids.clone()}
    adapter = ulysses_sp.UlyssesSPDataLoaderAdapter([batch], sp_rank=0, sp_group=None, sp_world_size=sp, device="cpu")
    try:
        next(adapter)
    except ValueError as err:
        assert "isn't divisible by sp-size" in str(err)
        return False
    return True


@pytest.mark.parametrize("sp", [2, 3, 4])
def test_a_sequence_length_sp_does_not_divide_is_refused_as_deepspeeds_adapter_refuses_it(monkeypatch, sp):
    for length in (8, 9, 10, 12):
        for written in (length, str(length)):  # accelerate's launch option is a string; YAML may hold either
            problems = accelerate_sp_rules(
                {"parallelism_config_sp_size": sp, "parallelism_config_sp_seq_length": written}
            )
            assert (not problems) == _deepspeed_splits(monkeypatch, length, sp), (length, sp, problems)
            for problem in problems:
                assert problem.path == "parallelism_config.parallelism_config_sp_seq_length"
                fixed = int(problem.fix.split("(e.g. ")[1].split(")")[0])
                assert _deepspeed_splits(monkeypatch, fixed, sp)


def test_eager_is_refused_by_deepspeed_and_by_accelerate(monkeypatch):
    """DeepSpeed's register_with_transformers refuses eager before it needs a process group; SDPA passes its
    attention checks and only then asks for the (here missing) group. accelerate refuses eager too, and also
    flex_attention, which DeepSpeed would take: accelerate builds the handler on every rank, so its word counts."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp, ulysses_sp

    monkeypatch.setattr(parallel_state_sp, "initialize_sequence_parallel", lambda sequence_parallel_size: None)
    shape = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=32, num_hidden_layers=1)
    shape.get_text_config = lambda: shape
    model = SimpleNamespace(config=shape)

    def register(attention: str) -> None:
        ulysses_sp.UlyssesSPAttentionHF.register_with_transformers(model, attention, 2, 1)

    with pytest.raises(ValueError, match="isn't currently supported by Ulysses"):
        register("eager")
    with pytest.raises(AssertionError, match="sequence parallel group is not initialized"):
        register("sdpa")
    for refused in ("eager", "flex_attention", "None", "paged|eager"):
        (problem,) = attention_problems(refused, "parallelism_config.parallelism_config_sp_attn_implementation")
        assert problem.severity == "error" and "accelerate refuses it" in problem.message and "sdpa" in problem.fix
    for accepted in ("sdpa", "flash_attention_2", "kernels-community/flash-attn2"):
        assert not attention_problems(accepted, "x"), accepted


def test_the_yaml_section_is_checked_against_accelerate_and_the_fixed_one_passes():
    def yaml(**section) -> dict:
        return {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "parallelism_config": section}

    good = {"parallelism_config_sp_size": 2, "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length": 8192, "parallelism_config_sp_attn_implementation": "sdpa"}  # fmt: skip
    assert check_accelerate_yaml(yaml(**good), []) == ([], [])
    bad = {**good, "parallelism_config_sp_seq_length": 8191, "parallelism_config_sp_attn_implementation": "eager",
           "parallelism_config_sp_sizes": 2}  # fmt: skip
    problems, _ = check_accelerate_yaml(yaml(**bad), [])
    said = {p.path: p for p in problems}
    assert set(said) == {
        f"parallelism_config.{key}"
        for key in (
            "parallelism_config_sp_seq_length",
            "parallelism_config_sp_attn_implementation",
            "parallelism_config_sp_sizes",
        )
    }
    assert "did you mean 'parallelism_config_sp_size'" in said["parallelism_config.parallelism_config_sp_sizes"].fix
    # sp 1 (no sequence parallelism): neither the length nor the attention is judged
    assert check_accelerate_yaml(yaml(**{**bad, "parallelism_config_sp_size": 1}), [])[0] == [
        said["parallelism_config.parallelism_config_sp_sizes"]
    ]


@pytest.mark.parametrize("release, scaled", [("0.18.3", False), ("0.19.5", False), ("0.19.6", True), ("0.19.8", True)])
def test_zero_0_1_2_gradients_under_ulysses_are_a_warning_from_deepspeed_0_19_6(monkeypatch, release, scaled):
    # Measured on each release (lint.installed.SP_GRADIENTS_SCALED_FROM): from 0.19.6 ZeRO-0/1/2 hand back sp x the
    # gradients of the HF Trainer's loss; the installed release's behaviour is held by tests/dist/test_bench_compare.py
    # (zero2_sp2's gradient norm is zero2's once zero-kit corrects it by this same function).
    from zero_kit.lint import installed

    monkeypatch.setattr(installed, "deepspeed_version", lambda: release)
    for stage in (0, 1, 2, 3):
        config = {**BASE, "zero_optimization": {"stage": stage}, "sequence_parallel_size": 4}
        problems = _sp_problems(config, LintContext(world_size=4), gradients=True)
        assert installed.ulysses_gradient_scale(stage, 4) == (0.25 if scaled and stage < 3 else 1.0)
        if not scaled or stage == 3:
            assert not problems, (stage, problems)
            continue
        (problem,) = problems
        assert problem.severity == "warning" and GRADIENTS in problem.message
        assert f"DeepSpeed {release} (>= 0.19.6) at ZeRO stage {stage}" in problem.message
        assert "4 x too large" in problem.message and "stage to 3" in problem.fix
    assert not _sp_problems({**BASE, "sequence_parallel_size": 1}, LintContext(world_size=4), gradients=True)

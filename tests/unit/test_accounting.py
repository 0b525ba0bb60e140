"""The shared byte tables: exact parameter counts of known LLaMA shapes (built on the meta device), and model-state
bytes against DeepSpeed 0.19.8's own estimators, called directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zero_kit.config.builder import overlap_comm
from zero_kit.dist import free_port
from zero_kit.plan.accounting import (
    ROWS,
    coefficients,
    model_state_bytes,
    zero12_edge_grad_bytes,
    zero12_grad_partition_elements,
)
from zero_kit.plan.memory import Workload, buffer_terms
from zero_kit.plan.shapes import KNOWN_SHAPES, LlamaShape, closest_known_shape, hf_config, shape_from_hf_config
from zero_kit.plan.traffic import zero3_kept_params
from zero_kit.strategies import strategy_info

# Published totals of the Meta checkpoints.
PUBLISHED = {
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "llama-2-70b": 68_976_648_192,
    "llama-3-70b": 70_553_706_496,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_param_counts_are_exact(name):
    assert KNOWN_SHAPES[name].n_params == PUBLISHED[name]


def _meta_model(shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**hf_config(shape))
    with torch.device("meta"):
        return LlamaForCausalLM(config), config


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-3-8b", "llama-2-70b", "llama-3.2-1b", "tinyllama-1.1b"])
def test_known_shapes_match_the_real_architecture(name):
    shape = KNOWN_SHAPES[name]
    model, config = _meta_model(shape)
    # parameters() yields a tied embedding once, which is how the checkpoints count it
    assert sum(p.numel() for p in model.parameters()) == shape.n_params
    # DeepSpeed's model_to_params: the largest module's own (non-recursive) parameters
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert shape.largest_layer_params == largest
    assert shape_from_hf_config(config.to_dict()) == shape
    # the order DeepSpeed flattens in decides which parameters straddle ZeRO-1/2 partition edges
    assert shape.param_numels() == [p.numel() for p in model.parameters()]


def test_zero12_grad_partitions_hold_edge_parameters_whole():
    # 4 params of 10 elements, 2 ranks: partitions [0, 20) and [20, 40) cut between params: exactly Ψ/N each.
    assert zero12_grad_partition_elements([10, 10, 10, 10], 2) == [20, 20]
    # [30, 10]: partition 20; the 30-element param starts in rank 0's and straddles into rank 1's, so both keep
    # all of it; rank 1 also starts the 10-element one.
    assert zero12_grad_partition_elements([30, 10], 2) == [30, 40]
    # padding to a multiple of 2N: 7 elements at N=2 -> 8, partitions of 4
    assert zero12_grad_partition_elements([3, 4], 2) == [7, 4]
    assert zero12_grad_partition_elements([5], 1) == [5]
    assert zero12_edge_grad_bytes([30, 10], 2, "fp32") == [40, 80]
    assert zero12_edge_grad_bytes([30, 10], 2, "bf16") == [20, 40]
    # a real shape at N=8: every rank holds at least its share and less than two extra whole parameters
    numels = KNOWN_SHAPES["llama-3-8b"].param_numels()
    held = zero12_grad_partition_elements(numels, 8)
    share = sum(numels) / 8
    assert all(share <= g < share + 2 * max(numels) for g in held)
    assert max(held) > 1.08 * share  # measured 1.086: the rank holding two whole 58.7M-element MLP edges


def test_closest_known_shape_by_parameter_count():
    assert closest_known_shape(8e9)[0] in ("llama-3-8b", "llama-3.1-8b")
    assert closest_known_shape(70e9)[0] in ("llama-3-70b", "llama-3.1-70b")
    assert closest_known_shape(1.2e9)[0] == "llama-3.2-1b"


# (shape, gpus per node, nodes): 1B to 70B, world sizes 1 to 64
CASES = [
    ("llama-3.2-1b", 1, 1),
    ("tinyllama-1.1b", 2, 1),
    ("llama-3.2-3b", 4, 1),
    ("llama-2-7b", 8, 1),
    ("llama-3-8b", 8, 1),
    ("llama-3-8b", 1, 1),
    ("llama-2-13b", 8, 2),
    ("llama-2-70b", 8, 4),
    ("llama-3-70b", 8, 8),
    ("llama-3-70b", 4, 1),
    ("llama-3.1-405b", 8, 8),
]


def _close(ours: int, theirs: int) -> bool:
    return abs(ours - theirs) <= 0.01 * theirs


@pytest.mark.parametrize("name,gpus,nodes", CASES)
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_matches_deepspeed_estimator(name, gpus, nodes, offload):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    n = KNOWN_SHAPES[name].n_params
    _, gpu_mem = estimate_zero2_model_states_mem_needs(n, gpus, nodes, cpu_offload=offload)
    ours = model_state_bytes("zero2", n, gpus * nodes, "bf16", offload_optimizer=offload)
    assert _close(ours.total, gpu_mem), (ours, gpu_mem)


@pytest.mark.parametrize("name,gpus,nodes", CASES)
@pytest.mark.parametrize("offload", ["none", "optimizer", "optimizer+param"])
def test_zero3_matches_deepspeed_estimator(name, gpus, nodes, offload):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    shape = KNOWN_SHAPES[name]
    n = shape.n_params
    _, gpu_mem, largest_layer_memory = estimate_zero3_model_states_mem_needs(
        n,
        shape.largest_layer_params,
        gpus,
        nodes,
        cpu_offload=offload != "none",
        cpu_offload_params=offload == "optimizer+param",
    )
    ours = model_state_bytes(
        "zero3",
        n,
        gpus * nodes,
        "bf16",
        offload_optimizer=offload != "none",
        offload_param=offload == "optimizer+param",
    )
    # DeepSpeed adds the largest layer gathered with its gradient; the planner counts it as a buffer.
    gathered, _ = buffer_terms("zero3", offload, Workload(shape, n), gpus * nodes)["largest layer gathered + grad"]
    assert gathered == largest_layer_memory
    assert _close(ours.total + gathered, gpu_mem), (ours, gathered, gpu_mem)


def test_deepspeed_all_live_estimators_go_through_the_count_functions():
    """The `_all_live` variants only take a model to count Ψ and then call the functions tested above."""
    import inspect

    from deepspeed.runtime.zero import stage3, stage_1_and_2

    assert "estimate_zero2_model_states_mem_needs_all_cold" in inspect.getsource(
        stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live
    )
    assert "estimate_zero3_model_states_mem_needs(" in inspect.getsource(
        stage3.estimate_zero3_model_states_mem_needs_all_cold
    )


# Measured with 2 CPU ranks (gloo), fp32, the tiny LLaMA, bytes of every live tensor just before optimizer.step():
# ddp 16Ψ, fsdp 16Ψ/N, zero0 16Ψ, zero1 and zero2 4Ψ + 16Ψ/N, zero3 20Ψ/N (see the module docstring).
# ZeRO-3 storages by owner (`benchmarks.state_bytes.run --rank-run zero3 --list-storages`, the same with the
# benchmark's client AdamW), Ψ = 3,148,224, N = 2, 6,296,448 B = 4Ψ/N each: param partition (ds_tensor views of
# fp16_partitioned_groups_flat), fp32_partitioned_groups_flat (its own storage, not the param partition),
# grad_partitions_flat_buffer, exp_avg, exp_avg_sq = 20Ψ/N; buffers, not model states: ipg bucket 147,456 B,
# 13 persistent params 9,984 B.
@pytest.mark.parametrize(
    "strategy,replicated,partitioned",
    [("ddp", 16, 0), ("fsdp", 0, 16), ("zero0", 16, 0), ("zero1", 4, 16), ("zero2", 4, 16), ("zero3", 0, 20)],
)
def test_fp32_tables_are_what_the_backends_keep(strategy, replicated, partitioned):
    n, world = 3_148_224, 2
    states = model_state_bytes(strategy, n, world, "fp32")
    assert states.total == replicated * n + partitioned * n // world


def test_fp32_offload_is_what_deepspeed_keeps():
    """Measured (2 CPU ranks, fp32, tiny LLaMA, Ψ = 3,148,224): ZeRO-3 + CPU offload 37,936,640 bytes in all;
    ZeRO-2 + CPU offload 47,221,376 = these states + the 16-bit partition buffer + 2 x largest-parameter buffers."""
    from zero_kit.model import tiny_llama_config

    n, world = 3_148_224, 2
    shape = shape_from_hf_config(tiny_llama_config().to_dict())
    assert shape.n_params == n
    zero3 = model_state_bytes("zero3", n, world, "fp32", offload_optimizer=True)
    assert _close(zero3.all_bytes, 37_936_640)
    zero2 = model_state_bytes("zero2", n, world, "fp32", offload_optimizer=True)
    staging = buffer_terms("zero2", "optimizer", Workload(shape, n, precision="fp32"), world)
    extra = staging["offload staging (2 x largest param)"][0] + staging["16-bit partition for updated params"][0]
    assert _close(zero2.all_bytes + extra, 47_221_376)


def test_mixed_precision_follows_the_paper_where_deepspeed_does():
    n, world = 1_000_000, 8
    assert model_state_bytes("ddp", n, world, "bf16").total == 16 * n
    assert model_state_bytes("fsdp", n, world, "bf16").total == 16 * n // world
    assert model_state_bytes("zero0", n, world, "fp16").formula == "16Ψ"
    assert model_state_bytes("zero2", n, world, "bf16").formula == "2Ψ + 18Ψ/N"
    assert model_state_bytes("zero3", n, world, "bf16").formula == "18Ψ/N"


def test_offload_moves_states_to_host():
    n, world = 8_000_000, 8
    states = model_state_bytes("zero3", n, world, "bf16", offload_optimizer=True)
    assert (states.params, states.grads, states.optimizer) == (2 * n // world, 0, 0)
    assert states.host_total == 18 * n // world and states.host_formula == "18Ψ/N"
    both = model_state_bytes("zero3", n, world, "bf16", offload_optimizer=True, offload_param=True)
    assert both.total == 0 and both.host_total == 20 * n // world
    zero2 = model_state_bytes("zero2", n, world, "bf16", offload_optimizer=True)
    assert zero2.total == 2 * n and zero2.host_total == 16 * n // world
    assert both.all_bytes == both.host_total


def test_lora_keeps_frozen_weights_and_adapter_states():
    n, trainable, world = 8_000_000, 40_000, 4
    zero2 = model_state_bytes("zero2", n, world, "bf16", trainable_params=trainable)
    assert zero2.params == 2 * (n - trainable) + 2 * trainable
    assert zero2.grads == 6 * trainable // world and zero2.optimizer == 12 * trainable // world
    assert zero2.formula == "2Ψf + 2Ψt + 18Ψt/N"
    zero3 = model_state_bytes("zero3", n, world, "bf16", trainable_params=trainable)
    assert zero3.params == 2 * n // world


def test_every_strategy_has_a_row_and_bad_names_are_refused():
    for strategy in ROWS:
        assert model_state_bytes(strategy, 1000, 2, "bf16").total > 0
        assert coefficients(strategy, "fp32").optimizer != (0, 0)
    with pytest.raises(ValueError, match="unknown strategy"):
        model_state_bytes("zero4", 1000, 2, "bf16")
    with pytest.raises(ValueError, match="parameter offload"):
        model_state_bytes("zero2", 1000, 2, "bf16", offload_optimizer=True, offload_param=True)


PROBE = Path(__file__).with_name("zero_buffers_probe.py")
PROBE_SHAPE = LlamaShape(64, 2, 4, 4, 128, 256, tie_word_embeddings=False)  # the probe's model


def test_reduce_buckets_and_kept_params_are_what_deepspeed_holds():
    """Real DeepSpeed engines on one CPU rank (zero_buffers_probe.py), the generator's configs: ZeRO-1/2 hold one
    reduce bucket without overlap_comm (CPU ranks) and two with it (GPUs); ZeRO-3 one, though it overlaps. ZeRO-3 keeps
    every parameter gathered from forward to backward at the generator's reuse distance, none as zero3_release runs
    (no reuse distance, live budget or prefetch: a prefetched parameter is not released either), and the last
    min(Ψ, reuse / 2) in between (to within a block); the planner charges the same."""
    runs = {
        "zero1 cpu": (1, "cpu", {}),
        "zero2 cpu": (2, "cpu", {}),
        "zero2 cuda": (2, "cuda", {}),
        "zero3 cpu": (3, "cpu", {}),
        "zero3 release": (3, "cpu", dict(strategy_info("zero3_release").zero_overrides)),
        "zero3 reuse psi": (3, "cpu", {"stage3_max_reuse_distance": PROBE_SHAPE.n_params}),
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(PROBE), str(stage), device, str(free_port()), json.dumps(overrides)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name, (stage, device, overrides) in runs.items()
    }
    held = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        held[name] = json.loads(out.strip().splitlines()[-1])
    work = Workload(PROBE_SHAPE, PROBE_SHAPE.n_params, precision="fp32")
    for name, (stage, device, overrides) in runs.items():
        record = held[name]
        terms = buffer_terms(f"zero{stage}", "none", work, 1, overlap=overlap_comm(stage, device),
                             zero_overrides=overrides)  # fmt: skip
        planned = sum(value for term, (value, _) in terms.items() if term.startswith("reduce bucket"))
        assert planned == 4 * sum(record["buffers"]) > 0, (name, record, terms)
        if stage == 3:
            assert record["params"] == PROBE_SHAPE.n_params
            kept = zero3_kept_params(overrides, record["params"])
            block = PROBE_SHAPE.block_params
            assert abs(record["kept"] - kept) <= block, (name, record, kept)
    assert held["zero3 cpu"]["kept"] == PROBE_SHAPE.n_params and held["zero3 release"]["kept"] == 0

"""Sanity cases a DeepSpeed user would agree with, and the activation formula against the tensors HF LLaMA
really saves for backward (CPU, SDPA)."""

from __future__ import annotations

import pytest

from zero_kit.plan import GIB, KNOWN_SHAPES, Hardware, Workload, make_plan, shape_from_hf_config
from zero_kit.plan.memory import activation_terms

GB = 10**9


def _plan(name, gpu_gb, gpus, nodes=1, n_params=None, **run):
    shape = KNOWN_SHAPES[name]
    hardware_keys = {"host_mem", "inter_node_gbps"}
    hardware = Hardware(gpu_gb * GB, gpus, nodes, **{k: v for k, v in run.items() if k in hardware_keys})
    work = Workload(shape, n_params or shape.n_params, **{k: v for k, v in run.items() if k not in hardware_keys})
    plan = make_plan(work, hardware)
    return plan, {o.label: o for o in plan.options}


def test_8b_full_finetune_on_8x80gb():
    plan, by = _plan("llama-3-8b", 80, 8, n_params=8 * 10**9)
    assert not by["ddp"].fits and not by["zero0"].fits  # 16 bytes/param replicated = 128 GB
    assert by["zero2"].fits and by["zero3"].fits and by["fsdp"].fits
    assert plan.recommended.label in ("zero1", "zero2")  # no parameter gathers needed, fewest bytes sent
    assert by["zero3"].comm_bytes_per_step == pytest.approx(1.5 * by["zero2"].comm_bytes_per_step)


def test_70b_on_8x80gb_needs_offload_and_checkpointing():
    plan, by = _plan("llama-3-70b", 80, 8, activation_checkpointing=True)
    assert not any(o.fits for o in plan.options if o.offload == "none")
    assert plan.recommended.strategy == "zero3" and plan.recommended.offload != "none"
    assert by["zero3+opt-offload"].host_bytes > 16 * KNOWN_SHAPES["llama-3-70b"].n_params  # 1.1 TB per node


def test_70b_on_4_nodes_shards_without_offload():
    plan, _ = _plan("llama-3-70b", 80, 8, nodes=4, activation_checkpointing=True)
    assert plan.recommended.strategy in ("zero3", "fsdp") and plan.recommended.offload == "none"


def test_70b_without_checkpointing_is_refused_with_the_fix():
    plan, _ = _plan("llama-3-70b", 80, 8)
    assert plan.recommended is None
    text = "\n".join(plan.reasons)
    # 68 GB of activations per GPU at seq 2048: more nodes cannot help, checkpointing or bigger GPUs can
    assert "short by" in text and "Would fit: --activation-checkpointing" in text and "GB each" in text


def test_a_long_sequence_is_sent_to_sequence_parallelism_within_the_node_not_to_more_nodes():
    """Issue 48: Llama-3-8B at 32k on one node of 8 x 80 GB fits nothing; the planner named 4 nodes (with activation
    checkpointing) where DeepSpeed's Ulysses over the node's 8 GPUs fits it."""
    plan, _ = _plan("llama-3-8b", 80, 8, seq_len=32768)
    assert plan.recommended is None
    fixes = [line for line in plan.reasons if line.startswith("Would fit:")]
    assert fixes[0].startswith("Would fit: --sp 8 with zero3 "), fixes
    assert not any("nodes of" in line for line in fixes), fixes
    sp, _ = _plan("llama-3-8b", 80, 8, seq_len=32768, sp=8)
    assert sp.recommended is not None


def test_1b_on_one_24gb_gpu():
    plan, by = _plan("llama-3.2-1b", 24, 1)
    assert not by["ddp"].fits  # 16 bytes x 1.24B = 19.8 GB before activations
    assert plan.recommended.offload != "none"
    lora, _ = _plan("llama-3.2-1b", 24, 1, lora_r=16)
    assert lora.recommended.offload == "none"


def test_small_host_ram_rules_out_offload():
    plan, by = _plan("llama-3-8b", 24, 1, host_mem=64 * GIB, activation_checkpointing=True)
    assert by["zero3+opt+param-offload"].fits_gpu and by["zero3+opt+param-offload"].fits_host is False
    assert plan.recommended is None
    assert any("Host RAM too small" in line for line in plan.reasons)


def test_slow_inter_node_link_prefers_fewer_bytes_over_no_offload():
    fast, _ = _plan("llama-3-8b", 40, 1, nodes=8, activation_checkpointing=True)
    slow, _ = _plan("llama-3-8b", 40, 1, nodes=8, inter_node_gbps=10, activation_checkpointing=True)
    assert fast.recommended.offload == "none" and fast.recommended.strategy in ("zero3", "fsdp")
    # on the slow link: the fewest bytes each node sends between nodes (zero_kit.plan.traffic); one GPU per node
    # leaves hpZ and HSDP nothing to keep inside a node, so ZeRO-3 (2.94aΨ) beats ZeRO-1/2's 3aΨ bucket all-reduce
    fitting = [o for o in slow.options if o.fits]
    assert slow.recommended.inter_node_bytes_per_node == min(o.inter_node_bytes_per_node for o in fitting)
    assert slow.recommended.label == "zero3"


def test_more_gpus_never_need_more_memory_per_gpu():
    small, _ = _plan("llama-2-13b", 80, 2)
    large, _ = _plan("llama-2-13b", 80, 8)
    for a, b in zip(small.options, large.options, strict=True):
        assert b.gpu_bytes()["model_states"] <= a.gpu_bytes()["model_states"]


def test_checkpointing_shrinks_activations():
    shape = KNOWN_SHAPES["llama-3-8b"]
    full = sum(v for v, _ in activation_terms(Workload(shape, shape.n_params)).values())
    ckpt = sum(v for v, _ in activation_terms(Workload(shape, shape.n_params, activation_checkpointing=True)).values())
    assert ckpt < full / 2


def _saved_bytes(layers: int, dtype, batch: int, seq: int) -> int:
    """Bytes of the distinct tensors autograd saves for backward in one forward of a tiny HF LLaMA (no weights)."""
    import torch
    from transformers import LlamaForCausalLM

    from zero_kit.model import tiny_llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(num_hidden_layers=layers, attn_implementation="sdpa")).to(dtype)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, labels=ids)
    return sum(saved.values())


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_per_layer_activations_match_what_hf_llama_saves(precision):
    import torch

    from zero_kit.model import tiny_llama_config

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    batch, seq = 2, 256
    measured_per_layer = _saved_bytes(2, dtype, batch, seq) - _saved_bytes(1, dtype, batch, seq)
    shape = shape_from_hf_config(tiny_llama_config(num_hidden_layers=1).to_dict())
    predicted, _ = activation_terms(Workload(shape, 1, seq, batch, precision))["saved activations, all layers"]
    assert measured_per_layer == pytest.approx(predicted, rel=0.02)


def test_memory_model_reads_the_stated_constants_from_assumptions():
    """plan.memory keeps no copy of Assumptions' defaults: its terms follow an --assume override."""
    from zero_kit.metrics import GIB as METRICS_GIB
    from zero_kit.plan.assumptions import Assumptions
    from zero_kit.plan.memory import buffer_terms

    shape = KNOWN_SHAPES["llama-3-8b"]
    work = Workload(shape, shape.n_params)
    default = buffer_terms("zero3", "none", work, 8)["CUDA context + NCCL"]
    assert default == (Assumptions().cuda_context_bytes, "1 GiB, stated") and GIB is METRICS_GIB
    custom = Assumptions(cuda_context_nccl_gib=2.5, host_baseline_gib=3.0)
    hardware = Hardware(gpu_mem=80 * GIB, gpus_per_node=8, assume=custom)
    option = make_plan(work, hardware).options[0]
    assert option.buffers["CUDA context + NCCL"][0] == int(2.5 * GIB)
    assert option.host["baseline per rank"] == (8 * 3 * GIB, "8 x 3 GiB")

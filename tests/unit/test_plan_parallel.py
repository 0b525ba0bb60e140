"""The planner's tensor/pipeline-parallel arithmetic (zero_kit.plan.parallel): AutoTP's split against DeepSpeed's own
spec matching on a real transformers model's parameter names, stage slices that add up to the model, the layout
groups' link tiers against every rank's successor, the bubble, and the state bytes of a trivial layout."""

from __future__ import annotations

import pytest

from zero_kit.metrics import ring_bytes
from zero_kit.plan import KNOWN_SHAPES, Workload, model_state_bytes
from zero_kit.plan.parallel import (
    Layout,
    bubble_fraction,
    layout_problems,
    parallel_collectives,
    parallel_state_bytes,
    stage_params,
    tp_split,
)
from zero_kit.plan.shapes import hf_config, shape_from_hf_config
from zero_kit.plan.traffic import Collective, grid_members, tier_bytes

LLAMA_TP_PLAN = {  # transformers' LlamaConfig.base_model_tp_plan and LlamaForCausalLM._tp_plan
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
    "lm_head": "colwise_gather_output",
}


def test_the_llama_plan_is_transformers_own():
    from transformers import LlamaConfig, LlamaForCausalLM

    plan = {**LlamaConfig.base_model_tp_plan, **LlamaForCausalLM._tp_plan}
    assert plan == LLAMA_TP_PLAN


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_tp_split_matches_deepspeed_spec_matching(bias, tied):
    """DeepSpeed converts the HF plan to layer specs and matches weights by name; a column layer splits its bias,
    a row layer keeps it whole (module_inject/layers.py LinearLayer / LinearAllreduce); the rest stays whole."""
    import torch
    from deepspeed.module_inject.autotp_config import AutoTPConfig, PartitionType
    from deepspeed.module_inject.tp_plan_converter import TPPlanConverter
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, attention_bias=bias, mlp_bias=bias,
                         tie_word_embeddings=tied)  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    specs = AutoTPConfig(tp_size=2, layer_specs=TPPlanConverter.convert(LLAMA_TP_PLAN))
    sharded = 0
    for name, param in model.named_parameters():
        spec = specs.find_matching_spec(name.replace(".bias", ".weight"), "llama")
        row_bias = spec is not None and name.endswith(".bias") and spec.partition_type == PartitionType.ROW
        sharded += param.numel() if spec is not None and not row_bias else 0
    shape = shape_from_hf_config({**hf_config(shape_from_hf_config(config.to_dict())), "model_type": "llama",
                                  "attention_bias": bias, "mlp_bias": bias})  # fmt: skip
    split = tp_split(shape)
    assert shape.n_params == sum(p.numel() for p in model.parameters())
    assert shape.layers * split.block_sharded + split.head_sharded == sharded


@pytest.mark.parametrize("name", sorted(KNOWN_SHAPES))
def test_stages_add_up_to_the_model(name):
    shape = KNOWN_SHAPES[name]
    assert sum(stage_params(shape, 1, 1)) == shape.n_params
    tied_copy = shape.vocab_size * shape.hidden_size if shape.tie_word_embeddings else 0
    assert sum(stage_params(shape, 1, 4)) == shape.n_params + tied_copy


def test_llama_70b_on_eight_tp_ranks_by_hand():
    # per layer q, o 8192²; k, v 8192 x 1024; gate, up, down 8192 x 28672, all / 8; two norms whole;
    # the embedding whole, the untied head / 8, the final norm whole
    block = (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) // 8 + 2 * 8192
    expected = 80 * block + 128256 * 8192 + 128256 * 8192 // 8 + 8192
    assert stage_params(KNOWN_SHAPES["llama-3-70b"], 8, 1) == [expected] == [9_739_706_368]


def _successor_split(c: Collective, world: int, per_node: int) -> tuple[float, float]:
    intra = inter = 0.0
    for rank in range(world):
        members = grid_members(rank, c.size, c.stride)
        peer = members[(members.index(rank) + 1) % len(members)]
        sent = ring_bytes(c.kind, c.payload, len(members))
        if peer // per_node == rank // per_node:
            intra += sent
        else:
            inter += sent
    return intra, inter


@pytest.mark.parametrize(("nodes", "per_node", "tp", "pp"), [(2, 8, 8, 2), (2, 8, 2, 1), (2, 4, 4, 1), (4, 2, 2, 2)])
def test_layout_groups_tiers(nodes, per_node, tp, pp):
    shape = KNOWN_SHAPES["llama-3-8b"]
    work = Workload(shape, shape.n_params, seq_len=1024)
    world = nodes * per_node
    layout = Layout(tp=tp, pp=pp, micro_batches=4)
    for c in parallel_collectives(work, layout, world):
        tiers = tier_bytes(c, nodes, per_node)
        if c.kind == "p2p":  # stages stride dp x tp: neighbours send both ways, the ends one way
            boundaries = world // pp * (pp - 1)
            assert tiers.intra_node + tiers.inter_node == 2 * boundaries * c.payload
        else:
            assert (tiers.intra_node, tiers.inter_node) == pytest.approx(_successor_split(c, world, per_node))
        if c.group == "tp" and tp <= per_node:
            assert tiers.inter_node == 0  # TP inside a node
    assert {c.group for c in parallel_collectives(work, layout, world)} >= {"tp"} | ({"pp"} if pp > 1 else set())


def test_pipeline_over_two_nodes_sends_activations_between_them():
    shape = KNOWN_SHAPES["llama-3-70b"]
    work = Workload(shape, shape.n_params, seq_len=4096)
    (p2p,) = [c for c in parallel_collectives(work, Layout(tp=8, pp=2, micro_batches=16), 16) if c.group == "pp"]
    assert p2p.payload == 16 * 4096 * shape.hidden_size * 2
    assert tier_bytes(p2p, 2, 8).inter_node == 2 * 8 * p2p.payload and tier_bytes(p2p, 2, 8).intra_node == 0


def test_bubble():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(2, 16) == pytest.approx(1 / 17)


def test_trivial_layout_is_the_byte_table():
    shape = KNOWN_SHAPES["llama-3-8b"]
    work = Workload(shape, shape.n_params)
    for base in ("zero1", "zero2", "fsdp", "ddp"):
        plain = model_state_bytes(base, shape.n_params, 8, "bf16")
        assert parallel_state_bytes(work, Layout(base=base), 8).as_dict() == plain.as_dict()
    tp8 = parallel_state_bytes(work, Layout(tp=8, base="zero1"), 16)
    assert tp8.total == model_state_bytes("zero1", max(stage_params(shape, 8, 1)), 2, "bf16").total
    assert tp8.formula == "2Ψr + 18Ψr/N_dp"


def test_layout_problems_name_the_values():
    shape = KNOWN_SHAPES["llama-2-13b"]  # 40 heads
    assert layout_problems(Layout(tp=16), shape, 16) == ["tp (16) does not divide the attention heads (40)"]
    assert "does not divide the world size (12)" in layout_problems(Layout(tp=8), KNOWN_SHAPES["llama-3-8b"], 12)[0]
    with pytest.raises(ValueError, match="LoRA"):
        parallel_state_bytes(Workload(shape, shape.n_params, lora_r=8), Layout(tp=2), 4)

"""Tensor/pipeline layouts as options of `zero-kit plan` (zero_kit.plan.parallel_options): which are tried, that
they train the flat options' global batch, the bubble in the step time, the reasons in numbers, and the CLI flags."""

from __future__ import annotations

import json

import pytest

from zero_kit.cli import main
from zero_kit.plan import KNOWN_SHAPES, Hardware, Workload, make_plan
from zero_kit.plan.parallel import bubble_fraction
from zero_kit.plan.parallel_options import default_layouts
from zero_kit.plan.rates import GPU_SPECS, Rates, peak_of

SHAPE = KNOWN_SHAPES["llama-3-70b"]
WORK = Workload(SHAPE, SHAPE.n_params, seq_len=4096, activation_checkpointing=True)
TWO_NODES = Hardware(141 * 10**9, gpus_per_node=8, nodes=2, inter_node_gbps=25)


def _rates(inter_gbps: float = 25) -> Rates:
    spec = GPU_SPECS["h200"]
    return Rates(peak_of(spec, "bf16") * 0.4, spec.intra_gbps * 1.25e8, inter_gbps * 1.25e8, 20e-6, 50e9, 200e9, 30,
                 0.8, "H200 x 0.4")  # fmt: skip


def test_default_layouts_follow_the_guide():
    labels = {(lay.tp, lay.pp, lay.base): lay.micro_batches for lay in default_layouts(WORK, TWO_NODES)}
    assert labels == {(8, 1, "zero1"): 8, (1, 2, "zero1"): 2, (8, 2, "zero1"): 16, (8, 1, "fsdp"): 8, (1, 2, "fsdp"): 2}
    assert default_layouts(WORK, Hardware(141 * 10**9, 1)) == []  # one GPU: nothing to split over
    lora = Workload(SHAPE, SHAPE.n_params, lora_r=8)
    assert default_layouts(lora, TWO_NODES) == []


def test_layouts_train_the_flat_global_batch_and_pay_the_bubble():
    plan = make_plan(WORK, TWO_NODES, _rates(), rank_by="time")
    flat = next(o for o in plan.options if o.label == "zero1")
    for option in (o for o in plan.options if o.layout is not None):
        t = option.timing
        assert t.tokens_per_step == flat.timing.tokens_per_step  # b x s x N
        layout = option.layout
        assert t.bubble_s == pytest.approx(t.compute_s * bubble_fraction(layout.pp, layout.micro_batches))
        if layout.pp == 1:
            assert t.bubble_s == 0 and t.compute_s == pytest.approx(flat.timing.compute_s)


def test_slow_link_reasons_say_why_the_pipeline_wins_in_numbers():
    plan = make_plan(WORK, TWO_NODES, _rates(), rank_by="time")
    assert plan.recommended.layout is not None and plan.recommended.layout.pp == 2
    text = "\n".join(plan.reasons)
    assert "tensor parallel over 8 GPUs inside one node" in text
    assert "bubble idles (p-1)/(m+p-1) =" in text and "micro batches per step" in text


def test_fast_fabric_keeps_data_parallelism_when_it_fits():
    small = KNOWN_SHAPES["llama-3-8b"]
    plan = make_plan(Workload(small, small.n_params), Hardware(80 * 10**9, 8, nodes=2))
    assert plan.recommended.layout is None
    assert any("Model parallelism is not needed" in reason for reason in plan.reasons)


def _plan(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "--gpus-per-node", "8", "--nodes", "2", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_layout_flags(capsys, tmp_path):
    code, out, _ = _plan(capsys, "--tp", "4", "--pp", "2", "--pp-micro-batches", "16", "--json")
    doc = json.loads(out)
    layouts = [o["layout"] for o in doc["options"] if o["layout"]]
    assert code == 0 and [layout["base"] for layout in layouts] == ["zero1", "fsdp"]
    assert layouts[0] == {"tp": 4, "pp": 2, "micro_batches": 16, "base": "zero1", "schedule": "1f1b"}
    code, out, _ = _plan(capsys, "--no-model-parallel", "--json")
    assert code == 0 and not any(o["layout"] for o in json.loads(out)["options"])
    code, _, err = _plan(capsys, "--tp", "3")
    assert code == 2 and "does not divide the attention heads (32)" in err and "fix:" in err
    path = tmp_path / "ds.json"
    code, out, err = _plan(capsys, "--inter-node-gbps", "10", "-o", str(path))
    assert code == 0 and "recommended: zero1+pp2" in out
    assert (
        "pipeline stages are your script's" in err and json.loads(path.read_text())["zero_optimization"]["stage"] == 1
    )

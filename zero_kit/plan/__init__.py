"""`zero-kit plan` as a library: which strategy fits a LLaMA-style model on given hardware, and why. Pure
arithmetic, nothing is launched. shapes (model dimensions) -> accounting (bytes per parameter, shared with the
benchmark) -> memory (every term of every planned strategy) -> recommend (ranking, reasons) -> render (text, JSON)."""

from zero_kit.metrics import GIB
from zero_kit.plan.accounting import StateBytes, model_state_bytes
from zero_kit.plan.memory import Hardware, Option, Workload
from zero_kit.plan.recommend import Plan, make_plan
from zero_kit.plan.render import render_json, render_text
from zero_kit.plan.shapes import KNOWN_SHAPES, LlamaShape, closest_known_shape, shape_from_hf_config

__all__ = [
    "GIB",
    "KNOWN_SHAPES",
    "Hardware",
    "LlamaShape",
    "Option",
    "Plan",
    "StateBytes",
    "Workload",
    "closest_known_shape",
    "make_plan",
    "model_state_bytes",
    "render_json",
    "render_text",
    "shape_from_hf_config",
]

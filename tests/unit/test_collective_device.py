"""Tensors handed to collectives live where the default group's backend reduces them: NCCL reduces only CUDA tensors
(a CPU tensor fails with "No backend type associated with device type cpu", seen on an H200 in `zero-kit train`'s
held-elements gather), gloo the CPU ones. CPU tests run gloo, so this is checked here, with the backend faked."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
import torch.distributed as dist

from zero_kit import dist as zk_dist

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVES = {"all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all_single"}  # fmt: skip


def test_nccl_gets_the_current_gpu_and_gloo_the_cpu(monkeypatch):
    monkeypatch.setattr(zk_dist, "initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    assert zk_dist.collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert zk_dist.collective_device() == torch.device("cpu")


def test_without_a_group_the_cpu():
    assert not zk_dist.initialized()
    assert zk_dist.collective_device() == torch.device("cpu")


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def test_every_collective_in_the_package_is_given_a_tensor_placed_for_the_backend():
    """A module of zero_kit that calls a tensor collective of torch.distributed places its tensors through
    `collective_device()` or a `device` it was given (the bench worker's), never on the default CPU."""
    offenders = []
    for path in sorted((ROOT / "zero_kit").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        collectives = [c for c in _calls(tree) if isinstance(c.func, ast.Attribute) and c.func.attr in COLLECTIVES
                       and isinstance(c.func.value, ast.Name) and c.func.value.id == "dist"]  # fmt: skip
        if not collectives:
            continue
        makers = [c for c in _calls(tree) if isinstance(c.func, ast.Attribute) and c.func.attr in
                  {"tensor", "zeros", "ones", "empty", "full"} and isinstance(c.func.value, ast.Name)
                  and c.func.value.id == "torch"]  # fmt: skip
        for maker in makers:
            if not any(k.arg == "device" for k in maker.keywords):
                offenders.append(f"{path.relative_to(ROOT)}:{maker.lineno}")
    assert not offenders, f"tensors for collectives made without device=: {offenders}"

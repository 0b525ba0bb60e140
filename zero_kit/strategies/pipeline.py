"""Pipeline parallelism with `torch.distributed.pipelining`: the LLaMA's decoder layers cut into `stages` contiguous
shares (the embedding joins the first, the final norm and head the last), one stage per rank, run by Schedule1F1B
over micro batches of the run's --micro-batch rows taken from the same global batch as every other strategy.

Ranks form a (pipeline, data parallel) mesh, the planner's order (zero_kit.plan.parallel): stages outermost, so a
stage's data-parallel peers are neighbours and, on whole nodes, only activations cross nodes. With more ranks than
stages each stage is wrapped in DDP over its data-parallel peers (torch's stage runs all but the last backward
under no_sync). Activations and their gradients cross stages as point-to-point sends (counted by metrics.CommCounter).

Phases (the bench's PhaseClock): the schedule runs forward and backward of its micro batches interleaved in one
call, so they are one phase, reported as forward (backward: none); reductions inside it (the stage's DDP) and the
optimizer step are split out as for every strategy, while the sends and receives between stages stay in it.

The bubble: each stage's forward and backward compute is timed (the stage's forward_one_chunk and
backward_one_chunk) inside the schedule's step; its idle fraction is 1 - busy / step wall time, to be held against
GPipe/1F1B's (p - 1) / (m + p - 1) for p stages and m micro batches.
"""

from __future__ import annotations

import time
from typing import Any

from zero_kit.metrics import storage_bytes
from zero_kit.strategies.base import Strategy as _Base
from zero_kit.strategies.base import StrategyOptions, make_optimizer, optimizer_state_tensors


def layer_split(layers: int, stages: int) -> list[tuple[int, int]]:
    """[start, end) of each stage's decoder layers: as even as the count allows, earlier stages one more."""
    if stages < 1 or layers < stages:
        raise ValueError(f"cannot cut {layers} decoder layers into {stages} pipeline stages; use layers >= stages")
    base, extra = divmod(layers, stages)
    bounds, start = [], 0
    for stage in range(stages):
        end = start + base + (stage < extra)
        bounds.append((start, end))
        start = end
    return bounds


def _stage_module(model, stage: int, stages: int):
    """The stage's share of a HF LLaMA as one module: tokens (first) or hidden states in, hidden states or logits
    (last) out. Rotary embeddings hold no parameters, so every stage computes its own; no mask is passed, so SDPA
    runs causal as the whole model does on unpadded rows."""
    import torch

    start, end = layer_split(len(model.model.layers), stages)[stage]

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            inner = model.model
            self.embed_tokens = inner.embed_tokens if stage == 0 else None
            self.layers = torch.nn.ModuleList(inner.layers[start:end])
            self.rotary_emb = inner.rotary_emb
            self.norm = inner.norm if stage == stages - 1 else None
            self.lm_head = model.lm_head if stage == stages - 1 else None

        def forward(self, x):
            hidden = self.embed_tokens(x) if self.embed_tokens is not None else x
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            rotary = self.rotary_emb(hidden, positions)
            for layer in self.layers:
                hidden = layer(hidden, position_ids=positions, position_embeddings=rotary)
            return self.lm_head(self.norm(hidden)) if self.lm_head is not None else hidden

    return Stage()


def causal_lm_loss(logits, labels):
    """transformers' causal-LM loss (ForCausalLMLoss without padding): mean cross-entropy of each next token."""
    import torch.nn.functional as F

    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab), labels[:, 1:].reshape(-1))


class PipelineStrategy(_Base):
    phases_apart = False  # Schedule1F1B interleaves micro batches' forwards and backwards in one call

    def __init__(self, model, options: StrategyOptions, *, stages: int, name: str = "pp") -> None:
        from torch.distributed.device_mesh import init_device_mesh

        if getattr(model.config, "tie_word_embeddings", False):
            raise ValueError("pp cannot split a model whose head shares the embedding's weight (tie_word_embeddings)")
        if options.world_size % stages:
            raise ValueError(f"pp needs a world size divisible by its {stages} stages, got {options.world_size}")
        self.options, self.name, self.stages = options, name, stages
        device_type = "cuda" if options.device.startswith("cuda") else "cpu"
        shape = (stages, options.world_size // stages)
        self.mesh = init_device_mesh(device_type, shape, mesh_dim_names=("pp", "dp"))
        self.stage_index = self.mesh.get_local_rank("pp")
        self.data_rank, self.data_world = self.mesh.get_local_rank("dp"), shape[1]
        self.module = _stage_module(model, self.stage_index, stages).to(options.device)
        self._wrapped = self._wrap_ddp(self.module)
        self.pp_group = self.mesh.get_group("pp")
        self.first, self.last = self.stage_index == 0, self.stage_index == stages - 1
        self.optimizer = make_optimizer(self.module.parameters(), options)
        self.busy = _BusyClock()
        self._schedule = None
        self.microbatches = 0

    def _wrap_ddp(self, module):
        if self.data_world == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel

        from zero_kit.strategies.ddp import WaitedAllReduce

        group = self.mesh.get_group("dp")
        ddp = DistributedDataParallel(module, process_group=group)
        # As in strategies/ddp.py: the stock all-reduce hook calls torch.distributed, so the byte counter sees it. Its
        # state holds the group it reduces over (None would mean the whole world: every stage at once, a hang).
        ddp.register_comm_hook(WaitedAllReduce(group), WaitedAllReduce.hook)
        return ddp

    def _schedule_for(self, microbatches: int):
        """Schedule1F1B over this rank's stage (built on the first step: it needs the micro-batch count)."""
        if self._schedule is None:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B

            stage = PipelineStage(self._wrapped, self.stage_index, self.stages, self.options.device,
                                  group=self.pp_group)  # fmt: skip
            self.busy.wrap(stage)
            self._schedule = Schedule1F1B(stage, n_microbatches=microbatches, loss_fn=causal_lm_loss)
        return self._schedule

    def data_split(self) -> tuple[int, int, int]:
        # One call per step: the schedule cuts the rows into micro batches itself.
        return self.data_rank, self.data_world, 1

    def params_held(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def forward_backward(self, batch: dict[str, Any], last: bool) -> float | None:
        rows = batch["input_ids"].shape[0]
        self.microbatches = rows // self.options.micro_batch
        schedule = self._schedule_for(self.microbatches)
        losses: list = []
        self.busy.begin()
        if self.first:
            schedule.step(batch["input_ids"])
        elif self.last:
            schedule.step(target=batch["labels"], losses=losses)
        else:
            schedule.step()
        self.busy.end()
        return sum(loss.item() for loss in losses) / len(losses) if losses else None

    def step(self) -> None:
        import torch
        import torch.distributed as dist

        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.options.gradient_clipping > 0:
            # The norm of the whole model's gradient: each stage's squared norm summed over the pipeline.
            squared = torch.nn.utils.get_total_norm([p.grad for p in params]) ** 2
            dist.all_reduce(squared, group=self.pp_group)
            torch.nn.utils.clip_grads_with_norm_(params, self.options.gradient_clipping, squared.sqrt())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def grad_bytes(self) -> int:
        return storage_bytes(p.grad for p in self.module.parameters())

    def param_and_optimizer_bytes(self) -> tuple[int, int]:
        return storage_bytes(self.module.parameters()), storage_bytes(optimizer_state_tensors(self.optimizer))

    def extra_record(self) -> dict[str, Any]:
        import torch.distributed as dist

        mine = {"stage": self.stage_index, "busy_s": self.busy.busy, "wall_s": self.busy.wall}
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        p, m = self.stages, self.microbatches
        return {"pipeline": {"stages": p, "microbatches": m, "schedule": "1F1B", "by_rank": every,
                             "bubble_theory": (p - 1) / (m + p - 1)}}  # fmt: skip

    def notes(self) -> str:
        return f"stage {self.stage_index}'s layers only: fp32 params, grads, AdamW state (a replica of the stage)"


class _BusyClock:
    """Per step: seconds the stage computes (forward_one_chunk + backward_one_chunk) and the schedule's wall time
    (the record leaves the warm-up steps out)."""

    def __init__(self) -> None:
        self.busy: list[float] = []
        self.wall: list[float] = []
        self._start = 0.0

    def wrap(self, stage) -> None:
        for method in ("forward_one_chunk", "backward_one_chunk"):
            original = getattr(stage, method)

            def timed(*args, _original=original, **kwargs):
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.busy[-1] += time.perf_counter() - start

            setattr(stage, method, timed)

    def begin(self) -> None:
        self.busy.append(0.0)
        self._start = time.perf_counter()

    def end(self) -> None:
        self.wall.append(time.perf_counter() - self._start)

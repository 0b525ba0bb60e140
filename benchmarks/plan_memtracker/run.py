"""Cross-check `zero-kit plan`'s per-GPU peak for DDP and FSDP2 against PyTorch's own memory trackers, at real
sizes, without a GPU: the model, the optimizer and every step run under FakeTensorMode on CPU (no real memory),
torch.distributed._tools.mem_tracker.MemTracker (DDP: one replica, which is what each DDP rank holds) and
torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker over a fake process group of N ranks (FSDP2).
These are private PyTorch APIs: used here and in tests/unit/test_plan_memtracker.py, never by zero_kit.

    OMP_NUM_THREADS=1 python -m benchmarks.plan_memtracker.run                       # 1B and 8B, seq 2048/8192
    python -m benchmarks.plan_memtracker.run --models llama-3.2-1b --seqs 2048 --json  # one case

The run: bf16 autocast (DDP) or FSDP2 MixedPrecisionPolicy(bf16 params, fp32 reduce) as zero_kit runs them,
AdamW, two steps (the peak is in the second, when Adam's moments exist), gradients kept between steps (DDP's
gradient_as_bucket_view buckets persist). The planner's figure compared is its GPU total less the two stated
terms no tracker can see: the CUDA context + NCCL (1 GiB) and the allocator slack (5%).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

WORLD = 8


def _hf_model(shape, checkpointing: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    from zero_kit.plan.shapes import hf_config

    config = LlamaConfig(**hf_config(shape), attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    model.train()
    if checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.23 (the old name warns there)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def _steps(model, optim, tokens, autocast: bool, tracker) -> None:
    import torch

    for step in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=False)
        if step == 0 and hasattr(tracker, "reset_mod_stats"):
            tracker.reset_mod_stats()


def tracked_peak(strategy: str, shape, seq: int, checkpointing: bool) -> dict[str, int]:
    """The tracker's snapshot at its peak for one training run under FakeTensorMode: bytes per category
    (parameters, gradients, optimizer states, activations, temporaries...) and "Total"."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    # The mesh reads real rank tensors: it is built before fake mode starts.
    mesh = None
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with FakeTensorMode():
        model = _hf_model(shape, checkpointing)
        tokens = torch.randint(0, shape.vocab_size, (1, seq))
        if strategy == "ddp":
            from torch.distributed._tools.mem_tracker import MemTracker

            optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
            tracker = MemTracker()
            tracker.track_external(model, optim)
            with tracker:
                _steps(model, optim, tokens, True, tracker)
        else:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in model.model.layers:
                fully_shard(block, mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
            tracker = FSDPMemTracker(model, optim)
            tracker.track_inputs((tokens,))
            with tracker:
                _steps(model, optim, tokens, False, tracker)
        snapshot = tracker.get_tracker_snapshot("peak")
    peak = max(snapshot.values(), key=lambda values: values["Total"])
    return {str(getattr(key, "value", key)): value for key, value in peak.items() if value}


def planned(strategy: str, shape, seq: int, checkpointing: bool, world: int) -> dict:
    from zero_kit.plan.memory import Hardware, Workload, evaluate
    from zero_kit.strategies import STRATEGIES

    work = Workload(shape, shape.n_params, seq, 1, "bf16", None, checkpointing)
    option = evaluate(STRATEGIES[strategy], work, Hardware(80 * 10**9, world, 1))
    total = option.gpu_bytes()["total"]
    unseen = option.buffers["CUDA context + NCCL"][0] + option.buffers["allocator slack"][0]
    terms = {
        name: value for part in (option.states, option.activations, option.buffers) for name, (value, _) in part.items()
    }
    return {"planner_total": total, "planner_tracked": total - unseen, "planner_terms": terms}


def start_fake_group(world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())


def case(name: str, shape, strategy: str, seq: int, checkpointing: bool, world: int) -> dict:
    started = time.perf_counter()
    row = {"model": name, "strategy": strategy, "seq": seq, "checkpointing": checkpointing, "world": world}
    row |= planned(strategy, shape, seq, checkpointing, world)
    try:
        row["tracker_terms"] = tracked_peak(strategy, shape, seq, checkpointing)
        row["tracker"] = row["tracker_terms"]["Total"]
        row["diff_pct"] = 100 * (row["planner_tracked"] / row["tracker"] - 1)
    except Exception as err:  # a tracker that cannot run here: say exactly what failed
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
    row["wall_s"] = time.perf_counter() - started
    return row


def shapes(names: list[str]):
    from zero_kit.plan.shapes import KNOWN_SHAPES, LlamaShape

    tiny = LlamaShape(hidden_size=256, layers=2, heads=4, kv_heads=2, intermediate_size=768, vocab_size=4096)
    return {name: tiny if name == "tiny" else KNOWN_SHAPES[name] for name in names}


def table(rows: list[dict]) -> str:
    gib = 2**30
    lines = [
        "| model | strategy | seq | ckpt | planner GiB (tracked terms) | tracker GiB | diff | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tracker = f"{r['tracker'] / gib:.2f}" if "tracker" in r else f"failed: {r['error']}"
        diff = f"{r['diff_pct']:+.1f}%" if "diff_pct" in r else "-"
        lines.append(
            f"| {r['model']} | {r['strategy']} | {r['seq']} | {'on' if r['checkpointing'] else 'off'} |"
            f" {r['planner_tracked'] / gib:.2f} | {tracker} | {diff} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3.2-1b,llama-3-8b", help="known shapes, or 'tiny'")
    parser.add_argument("--seqs", default="2048,8192")
    parser.add_argument("--strategies", default="ddp,fsdp")
    parser.add_argument("--checkpointing", default="off,on")
    parser.add_argument("--world", type=int, default=WORLD, help="FSDP2 ranks (fake process group)")
    parser.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start_fake_group(args.world)
    rows = []
    for name, shape in shapes(args.models.split(",")).items():
        for seq in (int(s) for s in args.seqs.split(",")):
            for ckpt in (c == "on" for c in args.checkpointing.split(",")):
                for strategy in args.strategies.split(","):
                    world = args.world if strategy == "fsdp" else 1
                    rows.append(case(name, shape, strategy, seq, ckpt, world))
                    if args.json:
                        print(json.dumps(rows[-1]), flush=True)
                    else:
                        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    if not args.json:
        import torch

        print(f"torch {torch.__version__}, FakeTensorMode on CPU, planner total less CUDA context + slack\n")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

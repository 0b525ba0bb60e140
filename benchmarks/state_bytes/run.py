"""Per-rank bytes every live tensor really occupies just before optimizer.step(), next to the formula in
`zero_kit.plan.accounting` that `zero-kit plan` and the benchmark use. Independent of the strategies' own byte readers:
it walks every tensor the Python garbage collector knows (parameters, .grad, optimizer state, DeepSpeed's flat
partitions and buckets alike) and counts each storage once. CPU, gloo, the embedded tiny LLaMA, 3 steps.

    python -m benchmarks.state_bytes.run --precision fp32               # all strategies, 2 ranks, prints a table

One strategy by hand (what the driver runs):
    deepspeed --num_gpus 2 --master_port 29910 --module benchmarks.state_bytes.run --rank-run zero3
    torchrun --nproc_per_node 2 --master_port 29911 -m benchmarks.state_bytes.run --rank-run fsdp

Every storage by owner (DeepSpeed attribute, optimizer state, module parameter), rank 0, with the benchmark's client
torch AdamW instead of the config's AdamW (`--optimizer client`; both give the same storages):
    deepspeed --num_gpus 2 --master_port 29950 --module benchmarks.state_bytes.run --rank-run zero3 --list-storages \
        --optimizer client
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

RUNS = ("ddp", "fsdp", "zero0", "zero1", "zero2", "zero3", "zero2+offload", "zero3+offload")
MIN_BYTES = 64  # ignore scalars (step counters, loss scale)
MODULE = "benchmarks.state_bytes.run"  # what the driver launches per rank, from the repository root


def live_storages() -> dict[int, tuple[int, str]]:
    """data_ptr -> (bytes, "dtype shape") of every storage the garbage collector can reach."""
    import torch

    storages: dict[int, tuple[int, str]] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = (storage.nbytes(), f"{obj.dtype} {tuple(obj.shape)}")
        except Exception:  # freed FSDP unsharded storages raise on access; they hold no bytes
            continue
    return storages


def live_storage_bytes() -> int:
    return sum(size for size, _ in live_storages().values() if size > MIN_BYTES)


def _tensors_in(value, depth: int = 0):
    """Tensors directly in an attribute value, or one container level (list, tuple, dict) deep."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 2 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item, depth + 1)
    elif depth < 2 and hasattr(value, "buffer"):  # ZeRO-3's ipg bucket objects
        yield from _tensors_in(value.buffer, depth + 1)


def storage_owners(engine) -> dict[int, str]:
    """data_ptr -> who holds it: the first of param partition, optimizer state, DeepSpeed optimizer attribute
    (ZeRO-3 parameter coordinator included), module parameter or gradient."""
    owners: dict[int, str] = {}

    def claim(tensors, label: str) -> None:
        for tensor in tensors:
            if tensor.device.type != "meta":
                owners.setdefault(tensor.untyped_storage().data_ptr(), label)

    zero = engine.optimizer
    inner = getattr(zero, "optimizer", zero)
    params = list(engine.module.parameters())
    claim([p.ds_tensor for p in params if hasattr(p, "ds_tensor")], "param partition (ds_tensor)")
    for state in getattr(inner, "state", {}).values():
        for key, value in state.items():
            claim(_tensors_in(value), f"optimizer.state[{key}]")
    for holder, prefix in ((zero, "zero"), (getattr(zero, "parameter_offload", None), "zero.parameter_offload")):
        for name, value in vars(holder or object()).items():
            claim(_tensors_in(value), f"{prefix}.{name}")
    claim(params, "module parameter (full or gathered)")
    claim([p.grad for p in params if p.grad is not None], "module parameter .grad")
    return owners


def print_storage_owners(engine, n_params: int, world_size: int) -> None:
    """Rank 0's storages above MIN_BYTES grouped by owner, largest first, in bytes and in Ψ/N."""
    owners = storage_owners(engine)
    rows: dict[str, list[int]] = {}
    for ptr, (size, what) in live_storages().items():
        if size > MIN_BYTES:
            row = rows.setdefault(owners.get(ptr, f"unowned {what}"), [0, 0])
            row[0], row[1] = row[0] + 1, row[1] + size
    print(f"| owner | storages | bytes | Ψ/N (N = {world_size}) |\n|---|---|---|---|")
    for label, (count, size) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"| {label} | {count} | {size:,} | {size * world_size / n_params:.3f} |")
    total = sum(size for _, size in rows.values())
    print(f"| total | | {total:,} | {total * world_size / n_params:.3f} |", flush=True)
    zero = engine.optimizer
    low_parts, masters = (getattr(zero, f"fp{b}_partitioned_groups_flat", []) for b in (16, 32))
    pairs = zip(low_parts, masters, strict=False)
    for i, (low, master) in enumerate(pairs):  # ZeRO-3: does the fp32 master reuse the parameter partition?
        shared = low.untyped_storage().data_ptr() == master.untyped_storage().data_ptr()
        print(f"sub-group {i}: fp32 master shares the parameter partition's storage: {shared}", flush=True)


def wrap(run: str, model, precision: str, world_size: int, client_optimizer: bool = False):
    """(forward-loss, backward, step, engine or None) for one strategy, configured like the benchmark."""
    import torch

    if run in ("ddp", "fsdp"):
        torch.distributed.init_process_group("gloo")
        if run == "ddp":
            module = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard

            for block in model.model.layers:
                fully_shard(block)
            module = fully_shard(model)
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        forward = lambda ids: module(input_ids=ids, labels=ids).loss  # noqa: E731
        return forward, (lambda loss: loss.backward()), optimizer.step, None
    import deepspeed

    from zero_kit.config.builder import build_ds_config
    from zero_kit.config.spec import ZeroSpec

    deepspeed.init_distributed(dist_backend="gloo")
    offload = "cpu" if run.endswith("+offload") else "none"
    spec = ZeroSpec(
        stage=int(run[4]),
        precision=precision,
        micro_batch=2,
        grad_accum=1,
        world_size=world_size,
        hidden_size=model.config.hidden_size,
        offload_optimizer=offload,
    )
    config = build_ds_config(spec)
    config["optimizer"]["params"]["torch_adam"] = True  # no compiled Adam kernels needed on CPU
    client = None
    if client_optimizer and offload == "none":  # what zero_kit.strategies.deepspeed hands DeepSpeed
        config.pop("optimizer")
        client = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), optimizer=client, config=config
    )
    return (lambda ids: engine(input_ids=ids, labels=ids).loss), engine.backward, engine.step, engine


def rank_run(run: str, precision: str, client_optimizer: bool = False, list_storages: bool = False) -> None:
    import torch
    import torch.distributed as dist

    from zero_kit.model import tiny_llama_config

    world_size = int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_llama_config())
    n_params = sum(p.numel() for p in model.parameters())
    forward, backward, step, engine = wrap(run, model, precision, world_size, client_optimizer)
    measured = 0
    for index in range(3):
        ids = torch.randint(0, model.config.vocab_size, (2, 32))
        loss = forward(ids)
        backward(loss)
        if index == 2:  # the peak of model states: gradients reduced, optimizer about to step
            del loss
            gc.collect()
            measured = live_storage_bytes()
            if list_storages and engine is not None and dist.get_rank() == 0:
                print_storage_owners(engine, n_params, world_size)
        step()
    if dist.get_rank() == 0:
        record = {"run": run, "precision": precision, "world_size": world_size, "n_params": n_params, "bytes": measured}
        print("RESULT " + json.dumps(record), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def predicted(run: str, n_params: int, world_size: int, precision: str) -> tuple[int, str]:
    """Model states from the shared tables; ZeRO-2 offload adds the staging buffers `zero-kit plan` counts."""
    from zero_kit.model import tiny_llama_config
    from zero_kit.plan.accounting import model_state_bytes
    from zero_kit.plan.memory import Workload, buffer_terms
    from zero_kit.plan.shapes import shape_from_hf_config

    strategy, offload = run.split("+")[0], run.endswith("+offload")
    states = model_state_bytes(strategy, n_params, world_size, precision, offload_optimizer=offload)
    total, formula = states.all_bytes, states.formula + (f" + host {states.host_formula}" if offload else "")
    if strategy == "zero2" and offload:
        work = Workload(shape_from_hf_config(tiny_llama_config().to_dict()), n_params, precision=precision)
        staging = buffer_terms("zero2", "optimizer", work, world_size)
        for name in ("offload staging (2 x largest param)", "16-bit partition for updated params"):
            total += staging[name][0]
            formula += f" + {staging[name][1]}"
    return total, formula


def drive(precision: str, port: int, runs: list[str], optimizer: str = "config") -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.getcwd()}
    print(f"| run | measured bytes/rank | formula | predicted | diff | ({precision}, 2 CPU ranks, gloo)")
    print("|---|---|---|---|---|")
    for index, run in enumerate(runs):
        launcher = (
            ["torchrun", "--nproc_per_node", "2", "--master_port", str(port + index), "-m"]
            if run in ("ddp", "fsdp")
            else ["deepspeed", "--num_gpus", "2", "--master_port", str(port + index), "--module"]
        )
        argv = [*launcher, MODULE, "--rank-run", run, "--precision", precision, "--optimizer", optimizer]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"| {run} | failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]} |||")
            continue
        record = json.loads(lines[0][len("RESULT ") :])
        total, formula = predicted(run, record["n_params"], record["world_size"], precision)
        diff = record["bytes"] / total - 1
        print(f"| {run} | {record['bytes']:,} | {formula} | {total:,} | {diff:+.2%} |", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rank-run", choices=RUNS, help="run one strategy as one rank (set by the driver)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of " + ",".join(RUNS))
    parser.add_argument("--port", type=int, default=29910, help="first master port; one per run")
    parser.add_argument(
        "--optimizer",
        choices=("config", "client"),
        default="config",
        help="DeepSpeed's config AdamW (torch_adam) or a client torch AdamW, as the benchmark passes",
    )
    parser.add_argument(
        "--list-storages", action="store_true", help="with --rank-run zeroN: print rank 0's storages grouped by owner"
    )
    parser.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)  # added by `deepspeed`
    args = parser.parse_args()
    if args.rank_run:
        rank_run(args.rank_run, args.precision, args.optimizer == "client", args.list_storages)
        return 0
    runs = args.runs.split(",")
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        parser.error(f"unknown runs {unknown}; choose from {list(RUNS)}")
    return drive(args.precision, args.port, runs, args.optimizer)


if __name__ == "__main__":
    sys.exit(main())

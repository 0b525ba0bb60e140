"""What each per-step piece of `zero-kit train` costs, timed alone on the ranks of a real 2-rank job (the same
launcher, threads and gloo group as the study's runs): the collectives its arguments and callbacks add to every
step, the files it writes, the line it prints, and the watchdog's background CPU. One rank; started by
`python -m benchmarks.train_overhead.run --costs` under the deepspeed launcher; rank 0 writes COSTS_JSON.

Per piece: the median over --calls calls (after 20 unrecorded ones), the ranks meeting in a barrier before each
block of a collective. For comparison, the plain Trainer's own per-step display (transformers' tqdm ProgressCallback: a bar update
and a written log line) is timed the same way.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

WARM = 20


def timed(call, calls: int, meet: bool = False) -> float:
    """Median seconds of one call (`meet`: every rank times it, after a barrier)."""
    import torch.distributed as dist

    for _ in range(WARM):
        call()
    if meet:
        dist.barrier()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def collectives(calls: int) -> dict:
    """Before: the Trainer's token count (include_num_input_tokens_seen, which zero-kit turned on: accelerate
    gathers one int64 per micro batch, then .item()) and PreemptionCallback's any_rank (a MAX all-reduce per step).
    Now: one all-reduce per step carries the stop flag and the step's tokens (zero_kit.train.callbacks)."""
    import torch
    import torch.distributed as dist

    from zero_kit.dist import any_rank, any_rank_and_sum

    world = dist.get_world_size()

    def gather():
        tokens = torch.as_tensor(123, dtype=torch.int64)
        out = torch.empty(world, dtype=torch.int64)
        dist.all_gather_into_tensor(out, tokens.reshape(1))  # what accelerate's gather does on gloo
        return out.sum().item()

    return {"token_count_gather": timed(gather, calls, meet=True),
            "preemption_any_rank": timed(lambda: any_rank(False), calls, meet=True),
            "stop_flag_and_tokens": timed(lambda: any_rank_and_sum(False, torch.tensor(350)), calls, meet=True)}  # fmt: skip


def files_and_lines(calls: int, work: Path) -> dict:
    """HeartbeatCallback's beat (a JSON file written and renamed; a beat that waits), ProgressCallback's on_log (a JSONL line appended,
    a progress line printed), ThroughputCallback's on_log; transformers' tqdm ProgressCallback for comparison."""
    from transformers.trainer_callback import ProgressCallback as HfProgress

    from zero_kit.train.callbacks import ProgressCallback, ThroughputCallback
    from zero_kit.watchdog import WRITE_EVERY_S, Heartbeat

    (work / "heartbeat").mkdir(exist_ok=True)
    # every beat written: what each step cost before a started heartbeat let beats of one phase wait
    every = Heartbeat(work / "heartbeat", rank=0, world_size=1, stall_timeout=300)
    # zero-kit train's started heartbeat: a beat waits, the file is rewritten at most every WRITE_EVERY_S
    waits = Heartbeat(work / "heartbeat", rank=1, world_size=1, stall_timeout=300, write_every_s=WRITE_EVERY_S)
    waits.beat("train", 0)
    args = SimpleNamespace(world_size=2, bf16=False, fp16=False)
    state = SimpleNamespace(is_world_process_zero=True, is_local_process_zero=True, global_step=7, max_steps=40,
                            epoch=0.2, num_input_tokens_seen=0)  # fmt: skip
    logs = {"loss": 6.5, "grad_norm": 2.0, "learning_rate": 5e-4, "epoch": 0.2}
    throughput, progress = ThroughputCallback(), ProgressCallback(work, None)
    throughput.on_train_begin(args, state, None)

    def on_log():
        state.num_input_tokens_seen += 350
        entry = dict(logs)
        throughput.on_log(args, state, None, logs=entry)
        progress.on_log(args, state, None, logs=entry)

    hf, hf_state = HfProgress(), SimpleNamespace(is_world_process_zero=True, global_step=0, max_steps=40)
    hf.on_train_begin(None, hf_state, None)

    def hf_step():
        hf_state.global_step += 1
        hf.on_step_end(None, hf_state, None)
        hf.on_log(None, hf_state, None, logs=dict(logs))

    sink = io.StringIO()
    with redirect_stdout(sink):  # the line's formatting and write, not a terminal's speed
        results = {
            "heartbeat_write": timed(lambda: every.beat("train", 7), calls),
            "heartbeat_beat_that_waits": timed(lambda: waits.beat("train", 7), calls),
            "throughput_and_progress_on_log": timed(on_log, calls),
            "hf_tqdm_progress_step_and_log": timed(hf_step, calls),
        }
    hf.training_bar.close()
    return results


def watchdog_cpu(work: Path, seconds: float) -> dict:
    """The guardian process and this rank's watcher thread, idle for `seconds`: CPU seconds per second each."""
    import psutil

    from zero_kit.watchdog import Heartbeat

    heartbeat = Heartbeat(work / "guarded", rank=0, world_size=1, stall_timeout=300).start()
    me = psutil.Process()
    watcher = [t for t in _threads() if t.name == "zero-kit-stall-watch"][0]
    thread_before = _thread_cpu(me, watcher.native_id)
    time.sleep(seconds)
    guardian = psutil.Process(heartbeat._guardian.pid).cpu_times()
    thread_after = _thread_cpu(me, watcher.native_id)
    heartbeat.stop()
    heartbeat._guardian.wait(timeout=30)
    return {"guardian_cpu_s_per_s": (guardian.user + guardian.system) / seconds,
            "watcher_thread_cpu_s_per_s": (thread_after - thread_before) / seconds}  # fmt: skip


def _threads():
    import threading

    return threading.enumerate()


def _thread_cpu(process, native_id: int) -> float:
    for thread in process.threads():
        if thread.id == native_id:
            return thread.user_time + thread.system_time
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON written by rank 0")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--idle-s", type=float, default=10.0, help="how long the watchdog is watched idle")
    args = parser.parse_args(argv)
    import deepspeed
    import torch
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    with tempfile.TemporaryDirectory() as tmp:
        results = {"collectives": collectives(args.calls)}
        if rank == 0:  # the files and the line are rank 0's alone in a run; the other rank waits at the next collective
            results["rank0"] = files_and_lines(args.calls, Path(tmp))
            results["watchdog"] = watchdog_cpu(Path(tmp), args.idle_s)
        dist.barrier()
    if rank == 0:
        results["threads"] = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "torch": torch.get_num_threads()}
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

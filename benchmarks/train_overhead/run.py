"""What `zero-kit train` costs on top of the plain Hugging Face Trainer (issue 36): its callbacks, heartbeat,
watchdog, progress line and run records, on the same DeepSpeed JSON, model, data and threads, 2 CPU ranks.

    python -m benchmarks.train_overhead.run --pairs 5 --steps 60       # stages 2 and 3, first side alternating
    python -m benchmarks.train_overhead.run --pairs 1 --stages 2 --steps 12 --warmup 3   # a quick look

A: `zero-kit train --nproc 2 --stage S --max-steps N --no-export --resume never` on the embedded tiny LLaMA and the
bundled data (the defaults). B: benchmarks/train_overhead/plain_hf.py under the same launcher zero-kit uses for
--nproc 2 (`python -m deepspeed.launcher.runner --num_gpus 2 --no_local_rank`, argv from zero_kit.launch), with
the DeepSpeed dict zero-kit's ranks build (zero_kit.train.plan.plan_run for this machine, written to a JSON
file once; after each A run it is checked equal to the dict in A's checkpoint-N/training_args.bin), the tiny
model saved once with save_pretrained (the same weights: zero_kit.model.load_model(None, seed=0)), the same
tokenized rows (zero-kit's cache entry, save_to_disk once), the same batch, lr schedule, clipping, seed, logging
every step, and OMP_NUM_THREADS = zero-kit's rule (zero_kit.dist.rank_threads: cores / 2 ranks) unless set.

The one measurement, the same on both sides: perf_counter at the Trainer's on_train_begin and at each step's log
event, taken by the first callback in the list (A: zero-kit's ThroughputCallback, read back from
OUTPUT/train_log.jsonl as tokens / tokens_per_s; B: plain_hf.StepClock). A step's time is the gap between two
log events; after --warmup steps, each run gives the median step time and tokens/s (tokens of those steps / their
time; tokens counted by the Trainer in A, by the collator of each rank in B, and checked equal step by step, with
the losses). Per pair A/B, per stage the median of the pairs. Results: results/<date>_<time>.json beside this file.

Beside it: every run's processes are sampled from outside (sampler.py), for the ranks' share of a core over the steps
(on a shared host: what other work left them; it tells a disturbed pair) and the CPU of zero-kit's own processes
(its relaunching parent, the guardians); and costs.py (--costs, on by default) times each per-step piece zero-kit
train adds, alone, on 2 ranks of the same launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.startup.measure import environment
from benchmarks.train_overhead.sampler import SAMPLE_S, CpuSampler

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RANKS = 2
# TrainingArguments fields that decide the step's work: equal on both sides, or the study stops
SAME_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "learning_rate",
               "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "logging_steps", "seed",
               "data_seed", "bf16", "fp16", "use_cpu", "ddp_backend", "dataloader_num_workers",
               "gradient_checkpointing", "optim", "adam_beta1", "adam_beta2", "adam_epsilon")  # fmt: skip


def options(stage: int, steps: int):
    from zero_kit.train.options import TrainOptions

    return TrainOptions(stage=stage, max_steps=steps, export=False, resume="never")


def prepare(work: Path, stages: list[int], steps: int) -> dict:
    """Once: the model directory, the tokenized data, one DeepSpeed JSON per stage, B's arguments."""
    from zero_kit.model import load_model, load_tokenizer
    from zero_kit.train import rundata
    from zero_kit.train.plan import Host, plan_run

    work.mkdir(parents=True, exist_ok=True)
    model, data = work / "model", work / "data"
    if not (model / "config.json").is_file():
        load_model(None, seed=0).save_pretrained(model)  # the embedded tiny LLaMA zero-kit trains by default
        load_tokenizer(None).save_pretrained(model)
    if not (data / "dataset_info.json").is_file():
        train, _, _ = rundata.prepare(options(2, steps), speak=False).train.load()  # zero-kit's own cache entry
        train.save_to_disk(str(data))
    cpu = Host(on_gpu=False, bf16_supported=False)
    configs, flags = {}, {}
    for stage in stages:
        run = plan_run(options(stage, steps), {"WORLD_SIZE": str(RANKS)}, cpu)  # the plan A's ranks run here
        configs[stage] = work / f"ds_stage{stage}.json"
        configs[stage].write_text(json.dumps(run.ds_config, indent=1) + "\n")
        opts = run.options
        flags[stage] = ["--micro-batch", str(run.micro_batch), "--grad-accum", str(run.grad_accum),
                        "--lr", repr(run.learning_rate), "--lr-scheduler", opts.lr_scheduler,
                        "--warmup-steps", str(opts.warmup_steps), "--weight-decay", repr(opts.weight_decay),
                        "--max-grad-norm", repr(opts.gradient_clipping), "--seed", str(opts.seed)]  # fmt: skip
    return {"model": model, "data": data, "configs": configs, "flags": flags, "grad_accum": options(2, 1).grad_accum}


def threads() -> str:
    """OMP_NUM_THREADS for B's ranks: the user's, else zero-kit's rule for 2 ranks on this host's usable cores."""
    from zero_kit.dist import rank_threads

    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    return given or str(rank_threads({"LOCAL_WORLD_SIZE": str(RANKS)}, len(os.sched_getaffinity(0))))


def execute(cmd: list[str], env: dict, log: Path, timeout: float, module: str) -> tuple[dict, CpuSampler]:
    """Run one side to its end (its own session; killed whole past `timeout`), its processes' CPU sampled: wall,
    load, CPU seconds of all its processes, and the sampler."""
    before, load = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0]
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        sampler = CpuSampler(proc.pid, module)
        while proc.poll() is None and time.perf_counter() - started < timeout:
            sampler.sample()
            time.sleep(SAMPLE_S)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        code = proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(cmd[:6])} ... exited {code}; log {log}:\n{tail}")
    result = {"wall_s": round(time.perf_counter() - started, 1), "load_at_start": round(load, 2),
              "cpu_s_all_processes": round(cpu, 1)}  # fmt: skip
    return result, sampler


def run_a(stage: int, steps: int, work: Path, inputs: dict, tag: str, timeout: float) -> dict:
    """zero-kit train, as a user runs it; its step times and tokens from its own train_log.jsonl."""
    out = work / "runs" / f"a_stage{stage}"
    shutil.rmtree(out, ignore_errors=True)
    argv = ["train", "--nproc", str(RANKS), "--stage", str(stage), "--max-steps", str(steps), "--no-export",
            "--resume", "never", "--output", str(out)]  # fmt: skip
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "zero_kit.cli", *argv]
    result, sampler = execute(cmd, env, work / f"{tag}.log", timeout, "zero_kit.cli")
    # the steps' wall-clock window: rank 0 writes the start-up record when step 1 ends, the log line of each step
    result["cpu_share_in_steps"] = sampler.shares((out / "zero_kit_startup.json").stat().st_mtime,
                                                  (out / "train_log.jsonl").stat().st_mtime)  # fmt: skip
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
    steps_seen, before = [], 0
    for r in (r for r in records if "loss" in r):
        tokens = r["tokens_seen"] - before
        steps_seen.append({"step": r["step"], "s": tokens / r["tokens_per_s"], "tokens": tokens, "loss": r["loss"]})
        before = r["tokens_seen"]
    startup = json.loads((out / "zero_kit_startup.json").read_text())
    args = _training_args(out / f"checkpoint-{steps}")
    ds = json.loads(inputs["configs"][stage].read_text())
    if args.deepspeed != ds:
        raise SystemExit(f"A's DeepSpeed dict differs from {inputs['configs'][stage]}:\n{args.deepspeed}")
    fields = {name: getattr(args, name) for name in SAME_FIELDS}
    return {"command": "zero-kit " + " ".join(argv), **result, "threads": startup["threads"], "args": fields,
            "steps": steps_seen, "same_ds_config": True}  # fmt: skip


def _training_args(checkpoint: Path):
    import torch

    # the Trainer's own pickle of the TrainingArguments in a checkpoint this study just wrote
    return torch.load(checkpoint / "training_args.bin", weights_only=False)


def launch_ranks(module: str, args: list[str], log: Path, timeout: float) -> tuple[dict, CpuSampler]:
    """`module args` as 2 ranks under the deepspeed launcher, started as zero-kit starts its own (its argv builder
    and launcher), with the environment zero-kit gives its ranks: threads, its op build directory (the shm op
    DeepSpeed loads at init is built there once), offline hubs, unbuffered output."""
    from zero_kit.dist import free_port
    from zero_kit.launch.argv import deepspeed_command
    from zero_kit.launch.ops import extensions_dir
    from zero_kit.train.parent import RUNNER

    port = free_port()
    cmd = deepspeed_command(module, args, nproc=RANKS, master_port=port, launcher=list(RUNNER.program),
                            no_local_rank=True)  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": threads(), "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    try:
        result, sampler = execute(cmd, env, log, timeout, module)
    finally:
        _release_shm(port)
    return {"command": " ".join(["python", *cmd[1:]]), **result}, sampler


def run_b(stage: int, steps: int, work: Path, inputs: dict, tag: str, timeout: float) -> dict:
    """The plain Trainer under the deepspeed launcher, as zero-kit starts its ranks; its StepClock and collator."""
    out = work / "runs" / f"b_stage{stage}"
    shutil.rmtree(out, ignore_errors=True)
    args = ["--model", str(inputs["model"]), "--data", str(inputs["data"]), "--ds-config",
            str(inputs["configs"][stage]), "--output", str(out), "--timing", str(out / "timing"),
            "--max-steps", str(steps), *inputs["flags"][stage]]  # fmt: skip
    result, sampler = launch_ranks("benchmarks.train_overhead.plain_hf", args, work / f"{tag}.log", timeout)
    ranks = [json.loads((out / "timing" / f"rank{r}.json").read_text()) for r in range(RANKS)]
    walls = [entry["wall"] for entry in ranks[0]["steps"]]  # step 1's end to the last step's, as in A
    result["cpu_share_in_steps"] = sampler.shares(walls[0], walls[-1])
    ga, last = inputs["grad_accum"], 0.0
    steps_seen = []
    for entry in ranks[0]["steps"]:
        k = entry["step"]
        tokens = sum(sum(r["tokens_per_micro_batch"][(k - 1) * ga : k * ga]) for r in ranks)
        steps_seen.append({"step": k, "s": entry["t"] - last, "tokens": tokens, "loss": entry["loss"]})
        last = entry["t"]
    fields = {name: ranks[0]["training_arguments"].get(name) for name in SAME_FIELDS}
    return {**result, "threads": ranks[0]["threads"], "args": fields, "steps": steps_seen}


def costs(work: Path, timeout: float) -> dict:
    """benchmarks/train_overhead/costs.py on 2 ranks: each per-step piece of zero-kit train, timed alone."""
    out = work / "costs.json"
    out.unlink(missing_ok=True)
    result, _ = launch_ranks("benchmarks.train_overhead.costs", ["--out", str(out)], work / "costs.log", timeout)
    return {**result, **json.loads(out.read_text())}


def _release_shm(port: int) -> None:
    """DeepSpeed's shm all-reduce op leaves one 66 MB /dev/shm file per rank (zero-kit's ranks remove theirs,
    zero_kit.launch.ops.release_shm_buffer; plain DeepSpeed does not): B's, named by its rendezvous port, go."""
    for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
        path.unlink(missing_ok=True)


def summary(steps: list[dict], warmup: int) -> dict:
    """After warm-up: the median step time, tokens/s (those steps' tokens over their time), the mean step time."""
    window = [s for s in steps if s["step"] > warmup]
    seconds = sum(s["s"] for s in window)
    return {"steps_timed": len(window), "median_step_s": round(statistics.median(s["s"] for s in window), 5),
            "mean_step_s": round(seconds / len(window), 5),
            "tokens_per_s": round(sum(s["tokens"] for s in window) / seconds, 1)}  # fmt: skip


def same_work(a: dict, b: dict) -> dict:
    """Whether both sides trained the same batches: tokens per step equal, and the largest loss difference."""
    pairs = list(zip(a["steps"], b["steps"], strict=True))
    tokens_equal = all(x["tokens"] == y["tokens"] for x, y in pairs)
    loss_diff = max(abs(x["loss"] - y["loss"]) for x, y in pairs)
    differing = {k: (a["args"][k], b["args"][k]) for k in SAME_FIELDS if a["args"][k] != b["args"][k]}
    return {"tokens_equal": tokens_equal, "max_loss_diff": loss_diff, "args_differ": differing}


def study(stage: int, pairs: int, steps: int, warmup: int, work: Path, inputs: dict, timeout: float,
          rows: list, save) -> dict:  # fmt: skip
    """`pairs` A/B pairs at `stage`, each appended to `rows` and saved (`save()`) as soon as it is done."""
    sides = {"A": run_a, "B": run_b}
    for index in range(pairs):
        order = "AB" if index % 2 == 0 else "BA"  # alternating first side: a drift of the machine cancels
        runs = {}
        for side in order:
            tag = f"stage{stage}_pair{index + 1}_{side}"
            runs[side] = sides[side](stage, steps, work, inputs, tag, timeout)
            runs[side]["summary"] = summary(runs[side]["steps"], warmup)
            print(f"stage {stage} pair {index + 1} {side}: {json.dumps(runs[side]['summary'])} "
                  f"load {runs[side]['load_at_start']}", flush=True)  # fmt: skip
        a, b = runs["A"]["summary"], runs["B"]["summary"]
        check = same_work(runs["A"], runs["B"])
        if check["args_differ"] or not check["tokens_equal"]:
            raise SystemExit(f"stage {stage} pair {index + 1}: A and B did not train the same batches: {check}")
        row = {"pair": index + 1, "order": order, "A": runs["A"], "B": runs["B"], "check": check,
               "step_ratio": round(a["median_step_s"] / b["median_step_s"], 4),
               "tokens_per_s_ratio": round(a["tokens_per_s"] / b["tokens_per_s"], 4)}  # fmt: skip
        print(f"stage {stage} pair {index + 1}: median step A/B {row['step_ratio']}, tokens/s A/B "
              f"{row['tokens_per_s_ratio']}, same work {json.dumps(check)}", flush=True)  # fmt: skip
        rows.append(row)
        save()
    return {"pairs": rows, "median_step_ratio": statistics.median(r["step_ratio"] for r in rows),
            "median_tokens_per_s_ratio": statistics.median(r["tokens_per_s_ratio"] for r in rows)}  # fmt: skip


def table(results: dict) -> str:
    lines = ["| stage | pair (order) | load at start A / B | ranks' CPU A / B | A median step | B median step | "
             "A / B step | A tokens/s | B tokens/s | A / B tokens/s |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for stage, res in results.items():
        for r in res["pairs"]:
            a, b = r["A"]["summary"], r["B"]["summary"]
            cpu = f"{r['A']['cpu_share_in_steps'].get('rank', 0):.0f}% / {r['B']['cpu_share_in_steps'].get('rank', 0):.0f}%"  # fmt: skip
            lines.append(f"| {stage} | {r['pair']} ({r['order']}) | {r['A']['load_at_start']} / "
                         f"{r['B']['load_at_start']} | {cpu} | {1000 * a['median_step_s']:.1f} ms | "
                         f"{1000 * b['median_step_s']:.1f} ms | {r['step_ratio']:.3f} | {a['tokens_per_s']:.0f} | "
                         f"{b['tokens_per_s']:.0f} | {r['tokens_per_s_ratio']:.3f} |")  # fmt: skip
        lines.append(f"| {stage} | **median** | | | | | **{res['median_step_ratio']:.3f}** | | | "
                     f"**{res['median_tokens_per_s_ratio']:.3f}** |")  # fmt: skip
        quiet = [r for r in res["pairs"] if quiet_pair(r)]
        if quiet:
            step = statistics.median(r["step_ratio"] for r in quiet)
            speed = statistics.median(r["tokens_per_s_ratio"] for r in quiet)
            lines.append(
                f"| {stage} | median of the {len(quiet)} quiet pair(s) | | | | | {step:.3f} | | | {speed:.3f} |"
            )
    return "\n".join(lines)


QUIET_SHARE = 75.0
"""A pair is quiet when the ranks of both sides got at least this much of a core over the steps (on an idle 2-core
host 80-85%: the rest is waiting in collectives); below, other work on the host took its share."""


def quiet_pair(row: dict) -> bool:
    return all(row[side]["cpu_share_in_steps"].get("rank", 0.0) >= QUIET_SHARE for side in "AB")


# what zero-kit train adds to each step (per optimizer step at grad_accum 1), and the plain Trainer's own display
PIECES = (
    ("collectives", "token_count_gather", "before: the Trainer's token count (include_num_input_tokens_seen), a gather per micro batch"),
    ("collectives", "preemption_any_rank", "before: PreemptionCallback, a MAX all-reduce of the stop flag"),
    ("collectives", "stop_flag_and_tokens", "now: one all-reduce of the stop flag and the step's tokens"),
    ("rank0", "heartbeat_write", "HeartbeatCallback before: rank<R>.json rewritten at every step"),
    ("rank0", "heartbeat_beat_that_waits", "HeartbeatCallback now: a beat that waits (the file: see below)"),
    ("rank0", "throughput_and_progress_on_log", "ThroughputCallback + ProgressCallback: train_log.jsonl line, progress line"),
    ("rank0", "hf_tqdm_progress_step_and_log", "plain Trainer (B, not A): tqdm bar update and its log line"),
)  # fmt: skip


def cost_table(found: dict, results: dict) -> str:
    """Each piece's median time per call and its share of the median step of B at each stage."""
    steps = {stage: statistics.median(r["B"]["summary"]["median_step_s"] for r in res["pairs"])
             for stage, res in results.items()}  # fmt: skip
    head = " | ".join(f"share of a stage-{stage} step" for stage in steps)
    lines = [f"| piece (per step) | median per call | {head} |", "|---|---|" + "---|" * len(steps)]
    for group, key, words in PIECES:
        seconds = found[group][key]
        shares = " | ".join(f"{100 * seconds / step:.2f}%" for step in steps.values())
        lines.append(f"| {words} | {1e6 * seconds:.0f} us | {shares} |")
    write = found["rank0"]["heartbeat_write"]
    lines.append(f"| HeartbeatCallback now: the file rewritten once a second (WRITE_EVERY_S), any step time | "
                 f"{1e6 * write:.0f} us a second | {100 * write:.2f}% of the time |" + " |" * (len(steps) - 1))  # fmt: skip
    dog = found["watchdog"]
    cpu = f"{100 * dog['guardian_cpu_s_per_s']:.2f}% / {100 * dog['watcher_thread_cpu_s_per_s']:.3f}% of a core"
    lines.append(f"| watchdog in the background: guardian process / watcher thread (CPU) | {cpu} |" + " |" * len(steps))
    for side, what, words in (("A", "parent", "zero-kit's relaunching parent (its supervisor), in A's steps"),
                              ("A", "guardian", "the 2 guardians, in A's steps"),
                              ("A", "launcher", "the deepspeed launcher's 2 processes, in A's steps"),
                              ("B", "launcher", "the deepspeed launcher's 2 processes, in B's steps")):  # fmt: skip
        shares = [r[side]["cpu_share_in_steps"].get(what, 0.0) for res in results.values() for r in res["pairs"]]
        lines.append(f"| {words} (median of the runs) | {statistics.median(shares):.2f}% of a core |" + " |" * len(steps))  # fmt: skip
    return "\n".join(lines)


def _uncommitted() -> list[str]:
    """zero_kit's files that differ from the recorded commit when the study ran (what A ran beside the commit)."""
    done = subprocess.run(["git", "status", "--porcelain", "--", "zero_kit"], capture_output=True, text=True, cwd=ROOT)
    return [line[3:] for line in done.stdout.splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="A/B pairs per stage, first side alternating")
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the figures")
    parser.add_argument("--work", default="build/train_overhead", help="model, data, configs, runs, logs")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run before it is killed")
    parser.add_argument("--costs", action=argparse.BooleanOptionalAction, default=True,
                        help="also time each per-step piece alone (costs.py, about 30 s)")  # fmt: skip
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    work, stages = Path(args.work).absolute(), [int(s) for s in args.stages.split(",")]
    inputs = prepare(work, stages, args.steps)
    record = {"environment": {**environment(), "zero_kit_uncommitted": _uncommitted()}, "threads_b": threads(),
              "steps": args.steps, "warmup": args.warmup,
              "ds_configs": {s: json.loads(p.read_text()) for s, p in inputs["configs"].items()}, "results": {}}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d_%H%M', time.gmtime())}.json"

    def save() -> None:  # after every pair: a run that fails later keeps what was measured
        record["environment"]["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]
        path.write_text(json.dumps(record, indent=1, default=str) + "\n")

    for stage in stages:
        rows: list = []
        record["results"][stage] = {"pairs": rows}
        record["results"][stage] = study(stage, args.pairs, args.steps, args.warmup, work, inputs, args.timeout,
                                         rows, save)  # fmt: skip
        save()
    if args.costs:
        record["costs"] = costs(work, args.timeout)
    save()
    print(table(record["results"]))
    if args.costs:
        print(cost_table(record["costs"], record["results"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A rank's start-up: its environment before any heavy import (threads per rank among it), and the time to first
step by stage (issue 23), measured on every run.

Stages, each from the end of the one before, in the order they happened: prepare (the data cache entry found or
built: zero_kit.train.rundata; a relaunching parent does it before any launcher), launch (to this rank's process
start: the launcher's own start-up; 0 without one), imports (torch, DeepSpeed and the Trainer's module loaded, with
what it imports: accelerate, datasets), rendezvous (the process group, DeepSpeed's comm and, when resuming at
another world size, the universal conversion), model (tokenizer and model build; ZeRO-3 builds inside zero.Init),
data (the datasets memory-mapped from the cache), engine (the Trainer and deepspeed.initialize, up to the Trainer's
on_train_begin), first_step (the first optimizer step, its first batch included).

Rank 0 prints one line and writes OUTPUT/zero_kit_startup.json when the first step ends. Wall clock (time.time),
because the first stages happen in another process: a relaunching parent passes its start and its prepare mark.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from zero_kit.dist import THP_ENV, free_port, set_rank_huge_pages, set_rank_threads, single_process_env, under_launcher
from zero_kit.log import library_notices_to_log, say
from zero_kit.plan.shapes import local_model_params
from zero_kit.watchdog import nccl_watchdog_env

STARTUP_FILE = "zero_kit_startup.json"
STARTED_ENV = "ZERO_KIT_STARTED"
"""Epoch seconds the command started at: set by a relaunching parent for its ranks."""
PREPARED_ENV = "ZERO_KIT_PREPARED"
"""Epoch seconds the relaunching parent's data preparation ended at."""
MEMORY_ENV = "ZERO_KIT_STARTUP_MEMORY"
"""Set to 1, each stage's end also records the rank's resident and private memory (the studies that need it set it:
benchmarks/data_scale, benchmarks/startup); off, the record keeps only the kernel's peak, read once."""
STAGES = ("prepare", "launch", "imports", "rendezvous", "model", "data", "engine", "first_step")


def rank_environment(plan) -> None:
    """For this rank of `plan` (a RunPlan): a world of one when no launcher started this process; offline hubs;
    threads and huge pages; the NCCL watchdog's variables."""
    opts = plan.options
    library_notices_to_log(opts.output)  # libraries' deprecations of each other: OUTPUT/zero_kit.log, not the terminal
    if not under_launcher():
        os.environ.update(single_process_env(opts.master_port or free_port()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_rank_threads()  # before torch's import: cores / local ranks, unless the user set OMP_NUM_THREADS
    trained = None if opts.lora_r else local_model_params(opts.model)  # LoRA gathers its adapters only
    set_rank_huge_pages(plan.zero_stage, trained, plan.precision)  # before torch's import too (zero_kit.dist)
    if opts.run_name:  # TensorBoard names its directory by date and host; the user's variable wins
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(Path(opts.output) / "runs" / opts.run_name))
    os.environ.update({k: v for k, v in nccl_watchdog_env(opts.stall_timeout).items() if k not in os.environ})


def process_start() -> float:
    """This process's start (epoch seconds, from the OS): the interpreter's own start-up counts as imports."""
    import psutil

    return psutil.Process().create_time()


def command_start() -> float:
    """When the command started: the relaunching parent's start, else this process's."""
    given = _epoch(os.environ.get(STARTED_ENV, ""))
    return process_start() if given is None else given


def _epoch(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class StartupClock:
    """Stage boundaries as wall-clock times; `mark(stage)` closes `stage`."""

    def __init__(self, command: float | None = None, process: float | None = None, memory: bool | None = None):
        self.command = command_start() if command is None else command
        parent = _epoch(os.environ.get(PREPARED_ENV, "")) if command is None else None
        self.marks: list[tuple[str, float]] = [("prepare", parent)] if parent is not None else []
        self.marks.append(("launch", process_start() if process is None else process))
        self.memory = os.environ.get(MEMORY_ENV) == "1" if memory is None else memory
        self.rss: dict[str, int] = {}
        """Resident bytes of this process at the end of each stage: the data stage's growth is the data's cost."""
        self.private: dict[str, int] = {}
        """Of them, the anonymous (private) bytes: the rest is file pages (libraries, memory-mapped data) that every
        process mapping the same file shares, one copy in the host's page cache."""

    def mark(self, stage: str) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown start-up stage {stage!r}; choose from {STAGES}")
        if stage not in self.done():
            self.marks.append((stage, time.time()))
            if not self.memory:
                return
            import psutil

            memory = psutil.Process().memory_info()
            self.rss[stage] = memory.rss
            if hasattr(memory, "shared"):  # Linux: resident file and shared-memory pages (statm), the rest is RssAnon
                self.private[stage] = memory.rss - memory.shared

    def done(self) -> list[str]:
        return [stage for stage, _ in self.marks]

    def stages(self) -> dict[str, float]:
        """Seconds per closed stage, in order (a clock skew of the launch stage reads as 0, never negative)."""
        starts = [self.command] + [at for _, at in self.marks[:-1]]
        return {stage: round(max(0.0, at - start), 3) for (stage, at), start in zip(self.marks, starts, strict=True)}

    def record(self) -> dict:
        import resource

        stages, mib = self.stages(), 2**20
        torch = sys.modules.get("torch")
        return {
            "time_to_first_step_s": round(sum(stages.values()), 3),
            "stages_s": stages,
            "rss_mib_after": {stage: round(rss / mib, 1) for stage, rss in self.rss.items()},
            "private_mib_after": {stage: round(anon / mib, 1) for stage, anon in self.private.items()},
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # Linux: KiB
            "threads": {
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                "torch": torch.get_num_threads() if torch else None,
            },  # fmt: skip
            "huge_pages": os.environ.get(THP_ENV),  # zero_kit.dist.set_rank_huge_pages
            "measured": "rank 0: wall clock from the command's start, each stage from the end of the one before; "
            "resident memory of this rank's process at each stage's end (of it private: RssAnon) and its peak "
            "(getrusage)",
        }

    def line(self) -> str:
        record = self.record()
        parts = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in record["stages_s"].items())
        return f"zero-kit train: time to first step {record['time_to_first_step_s']:.1f} s ({parts})"

    def finish(self, output: Path) -> None:
        """Rank 0, after the first step: the JSON beside the run record, and one line."""
        from zero_kit.checkpoints.store import atomic_write_text

        atomic_write_text(output / STARTUP_FILE, json.dumps(self.record(), indent=1) + "\n")
        say(self.line())

    def for_ranks(self) -> dict[str, str]:
        """The variables a relaunch's ranks continue this clock from: the command's start, the prepare mark."""
        prepared = [at for stage, at in self.marks if stage == "prepare"]
        return {STARTED_ENV: repr(self.command), **({PREPARED_ENV: repr(prepared[0])} if prepared else {})}

    def imports(self) -> None:
        """Load the heavy libraries now, so that their cost is one stage and not spread over the others. The
        Trainer's module imports accelerate and `datasets` (the data stage then holds only the data's cost)."""
        import deepspeed  # noqa: F401
        import torch  # noqa: F401
        from transformers import Trainer  # noqa: F401

        self.mark("imports")


def milestones(clock: StartupClock, beat: Callable[[], None]) -> Callable[[str], None]:
    """One call per start-up milestone: closes the stage and beats the stall watchdog (each part of the start-up
    gets the long-phase allowance, not all of them together)."""

    def reached(stage: str) -> None:
        clock.mark(stage)
        beat()

    return reached

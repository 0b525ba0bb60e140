"""The driver behind `zero-kit bench`: a real launch per strategy, progress display, then JSONL + markdown table
+ PNG plots (zero_kit.bench.report)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from zero_kit.bench.options import PROGRESS, BenchOptions
from zero_kit.bench.worker import model_config


def _launch_command(strategy: str, opts: BenchOptions, index: int, record: str) -> list[str]:
    from zero_kit.launch import deepspeed_command, torchrun_command
    from zero_kit.strategies import check_name

    args = ["--strategy", strategy, "--options-json", json.dumps(dataclasses.asdict(opts)), "--record", record]
    port = opts.master_port + index
    if check_name(strategy).launcher == "deepspeed":
        return deepspeed_command("zero_kit.bench", args, nproc=opts.nproc, master_port=port)
    return torchrun_command("zero_kit.bench", args, nproc=opts.nproc, master_port=port)


def _run_one(strategy: str, opts: BenchOptions, index: int, out_dir, progress) -> tuple[dict | None, str]:
    """Launch one strategy; returns (record or None, log path). Progress lines from rank 0 go to `progress`."""
    import subprocess
    import tempfile

    log_path = out_dir / "logs" / f"{strategy}.log"
    fd, record_path = tempfile.mkstemp(suffix=".jsonl", dir=out_dir / "logs")
    os.close(fd)
    command = _launch_command(strategy, opts, index, record_path)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n")
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        try:
            _pump(proc, log, progress, opts.timeout)
        finally:
            _stop(proc)
    with open(record_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    os.unlink(record_path)
    if proc.returncode != 0 or not lines:
        return None, str(log_path)
    record = json.loads(lines[-1])
    record["command"] = " ".join(command)
    return record, str(log_path)


def _pump(proc, log, progress, timeout: float) -> None:
    import threading

    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            log.write(line)
            if line.startswith(PROGRESS):
                progress(line[len(PROGRESS) :].strip())
        proc.wait()
    finally:
        timer.cancel()


def _stop(proc) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's own process group (start_new_session)
        proc.wait()


def run_bench(opts: BenchOptions, progress=None) -> list[dict]:
    """Every strategy as a real launch; then results.jsonl, table.md and PNG plots in opts.out."""
    from pathlib import Path

    from zero_kit.bench.report import failed_record, write_outputs
    from zero_kit.strategies import check_name

    names = [n.strip() for n in opts.strategies.split(",") if n.strip()]
    for name in names:
        check_name(name)
    model_config(opts)
    out_dir = Path(opts.out)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    records = []
    for index, name in enumerate(names):
        progress(f"[{index + 1}/{len(names)}] launching {name} on {opts.nproc} ranks")
        record, log_path = _run_one(name, opts, index, out_dir, progress)
        records.append(record or failed_record(name, opts, log_path))
    write_outputs(records, out_dir)
    return records

"""The driver behind `zero-kit bench`: a real launch per strategy (on this host, across a hostfile's hosts, or
across a SLURM allocation: see placement.py), progress display, then JSONL + markdown table + PNG plots
(zero_kit.bench.report). Every strategy of one run lands in one results directory."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from zero_kit.bench.options import PROGRESS, BenchOptions
from zero_kit.bench.placement import Placement, commands, place
from zero_kit.bench.worker import model_config

RUN_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _run_one(strategy: str, opts: BenchOptions, index: int, out_dir: Path, where: Placement, progress):
    """Launch one strategy; returns (record or None, log path). Progress lines from rank 0 go to `progress`."""
    import subprocess
    import tempfile

    log_path = out_dir / "logs" / f"{strategy}.log"
    fd, record_path = tempfile.mkstemp(suffix=".jsonl", dir=out_dir / "logs")
    os.close(fd)
    run_dir = out_dir / "logs" / f"{strategy}.launch"
    run_dir.mkdir(exist_ok=True)
    argvs, extra = commands(strategy, opts, opts.master_port + index, record_path, where, run_dir)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **RUN_ENV, **extra}
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("".join(" ".join(argv) + "\n" for argv in argvs))
        procs = [
            subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
                start_new_session=True,
            )  # fmt: skip
            for argv in argvs
        ]
        try:
            _pump(procs, log, progress, opts.timeout)
        finally:
            for proc in procs:
                _stop(proc)
    with open(record_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    os.unlink(record_path)
    if any(proc.returncode != 0 for proc in procs) or not lines:
        return None, str(log_path)
    record = json.loads(lines[-1])
    record["command"] = " ;; ".join(" ".join(argv) for argv in argvs)
    record["launch"] = where.describe()
    return record, str(log_path)


def _pump(procs, log, progress, timeout: float) -> None:
    """Every process's output into the log (rank 0's progress lines also to `progress`), until all have ended
    or `timeout` seconds passed (then all are killed). One process failing ends the others: a rank that lost
    its peers would otherwise wait for them until its collective timeout."""
    lock = threading.Lock()
    failed = threading.Event()

    def read(proc) -> None:
        for line in proc.stdout:
            line = line.replace("\r", "")  # ssh -tt output
            with lock:
                log.write(line)
                if line.startswith(PROGRESS):
                    progress(line[len(PROGRESS) :].strip())
        if proc.wait() != 0:
            failed.set()

    readers = [threading.Thread(target=read, args=(proc,), daemon=True) for proc in procs]
    for reader in readers:
        reader.start()
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while any(r.is_alive() for r in readers) and not deadline.is_set() and not failed.is_set():
            readers[0].join(0.2)
    finally:
        timer.cancel()
        if deadline.is_set() or failed.is_set():
            for proc in procs:
                _stop(proc)
        for reader in readers:
            reader.join(10)


def _stop(proc) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's own process group (start_new_session)
        proc.wait()


def run_bench(opts: BenchOptions, progress=None) -> list[dict]:
    """Every strategy as a real launch; then results.jsonl, table.md and PNG plots in opts.out."""
    from zero_kit.bench.report import failed_record, write_outputs
    from zero_kit.strategies import check_name

    names = [n.strip() for n in opts.strategies.split(",") if n.strip()]
    for name in names:
        check_name(name)
    model_config(opts)
    where = place(opts, dict(os.environ))
    out_dir = Path(opts.out)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    records = []
    for index, name in enumerate(names):
        how = f"{where.nodes} node(s) x {where.ranks_per_node} rank(s), {where.mode}"
        progress(f"[{index + 1}/{len(names)}] launching {name} on {how}")
        record, log_path = _run_one(name, opts, index, out_dir, where, progress)
        records.append(record or failed_record(name, opts, log_path))
    write_outputs(records, out_dir)
    return records

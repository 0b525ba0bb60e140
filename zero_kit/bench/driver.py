"""The driver behind `zero-kit bench`: a real launch per strategy (on this host, across a hostfile's hosts, or
across a SLURM allocation: see placement.py), progress display, then JSONL + markdown table + PNG plots
(zero_kit.bench.report). Every strategy of one run lands in one results directory.

SIGINT (Ctrl-C) or SIGTERM reaches every rank of the strategy running (zero_kit.launch.supervise); the strategies
already finished are written as usual, one last line says what happened, and the process exits 128 + the signal's
number (130, 143) as the signal would have ended it."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

from zero_kit.bench.options import PROGRESS, BenchOptions, strategy_names
from zero_kit.bench.placement import place, rank_args
from zero_kit.bench.user_config import check_user_config, differences, write_launch_copy
from zero_kit.bench.worker import model_config
from zero_kit.launch import Placement
from zero_kit.log import warn

RUN_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _run_one(strategy: str, launcher: str, opts: BenchOptions, index: int, out_dir: Path, where: Placement, progress):
    """Launch one strategy; returns (record or None, log path, the signal that stopped it or None). Progress lines
    from rank 0 go to `progress`."""
    import tempfile

    from zero_kit.launch import Launcher, Output, launch_commands, supervise

    log_path = out_dir / "logs" / f"{strategy}.log"
    fd, record_path = tempfile.mkstemp(suffix=".jsonl", dir=out_dir / "logs")
    os.close(fd)
    run_dir = out_dir / "logs" / f"{strategy}.launch"
    run_dir.mkdir(exist_ok=True)
    port = _rendezvous_port(opts.master_port + index, where, strategy, progress)
    launch = launch_commands("zero_kit.bench", rank_args(strategy, opts, record_path), where, Launcher(launcher),
                             port=port, run_dir=run_dir)  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **RUN_ENV}
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("".join(" ".join(argv) + "\n" for argv in launch.argvs))
        lock = threading.Lock()

        def on_line(_process: int, line: str) -> None:
            with lock:
                log.write(line)
                if line.startswith(PROGRESS):
                    progress(line[len(PROGRESS) :].strip())

        outcome = supervise(launch, env=env, timeout=opts.timeout, output=Output(on_line=on_line))
    with open(record_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    os.unlink(record_path)
    if outcome.exit_code != 0 or not lines:
        return None, str(log_path), outcome.signal
    record = json.loads(lines[-1])
    record["command"] = " ;; ".join(" ".join(argv) for argv in launch.argvs)
    record["launch"] = where.describe()
    return record, str(log_path), None


def _rendezvous_port(port: int, where: Placement, strategy: str, progress) -> int:
    """A run's rendezvous port: `port` (--master-port + the run's index), or on one host, where something holds that
    one already, a free one, said on the progress line: there the port only joins this host's ranks, and a busy one
    would fail the run (EADDRINUSE from the launcher's store). Runs on several nodes keep `port`, which every node
    was given."""
    from zero_kit.dist import free_port, port_in_use

    if where.mode != "local" or not port_in_use(port):
        return port
    other = free_port()
    progress(f"port {port} is in use on this host: {strategy} meets on port {other} instead")
    return other


def run_bench(opts: BenchOptions, progress=None) -> list[dict]:
    """Every strategy as a real launch; then results.jsonl, table.md and PNG plots in opts.out."""
    from zero_kit.bench.report import failed_record, write_outputs
    from zero_kit.strategies import check_model_parallel, check_name

    names = strategy_names(opts)
    infos = [check_name(name) for name in names]
    where = place(opts, dict(os.environ))
    user = _user_config(opts, where)
    if user is not None:  # one more run, after the named strategies
        names, infos = [*names, user.name], [*infos, user.info]
    config = model_config(opts)
    for info in infos:
        check_model_parallel(info, where.nodes * where.ranks_per_node, config.num_hidden_layers,
                             config.num_key_value_heads, bool(config.tie_word_embeddings), opts.grad_accum)  # fmt: skip
    check_sequence_parallel(infos, where.nodes * where.ranks_per_node, config, opts.seq_len)
    out_dir = Path(opts.out)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    progress = progress or (lambda line: warn(line))
    if user is not None:
        write_launch_copy(user, out_dir)
        differs = differences(user.config, opts)
        if differs:
            progress(f"{user.name} trains otherwise than the bench's strategies (its losses differ from DDP's by"
                     f" design): {'; '.join(differs)}")  # fmt: skip
    records = []
    for index, (name, info) in enumerate(zip(names, infos, strict=True)):
        how = f"{where.nodes} node(s) x {where.ranks_per_node} rank(s), {where.mode}"
        progress(f"[{index + 1}/{len(names)}] launching {name} on {how}")
        record, log_path, stopped_by = _run_one(name, info.launcher, opts, index, out_dir, where, progress)
        if stopped_by is not None:  # Ctrl-C or SIGTERM ends the whole bench, not just this strategy
            _stop(stopped_by, name, records, out_dir)
        records.append(record or failed_record(name, opts, log_path))
    write_outputs(records, out_dir)
    return records


def check_sequence_parallel(infos, world: int, config, seq_len: int) -> None:
    """Refuse, before any launch, a `_spN` run Ulysses cannot split (every problem at once, with its fix): N not
    dividing the ranks (DeepSpeed's initialize_sequence_parallel raises), heads it cannot divide (lint.rules_ulysses,
    from UlyssesSPAttentionHF), a row length not a multiple of N (each rank takes an equal slice)."""
    from zero_kit.config.builder import data_parallel_size
    from zero_kit.errors import UserError, raise_all
    from zero_kit.lint.rules_ulysses import heads_split

    problems = []
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    for sp in sorted({info.sequence_parallel for info in infos if info.sequence_parallel > 1}):
        try:
            data_parallel_size(world, sp, "--nproc")
        except UserError as err:
            problems.append(err)
        if not heads_split(heads, kv, sp):
            problems.append(UserError(f"--sp {sp}: Ulysses cannot split {heads} attention heads ({kv} key-value heads)"
                                      f" over {sp} ranks", "an --sp that divides the attention heads, and that the"
                                      " key-value heads divide or are divided by"))  # fmt: skip
        if seq_len % sp:
            problems.append(UserError(f"--sp {sp}: --seq-len {seq_len} is not a multiple of {sp} (each rank takes an"
                                      " equal slice of every row)", f"--seq-len {seq_len - seq_len % sp + sp}"))  # fmt: skip
    raise_all(problems, "before launching")


def _user_config(opts: BenchOptions, where: Placement):
    """--ds-config checked for this placement (None without one), judged for this machine's device where the ranks
    run here or in this allocation (a hostfile's hosts may differ: their device is not judged)."""
    if not opts.ds_config:
        return None
    device = None
    if where.mode in ("local", "slurm"):
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return check_user_config(opts, where.nodes * where.ranks_per_node, where.ranks_per_node, device)


def _stop(signum: int, running: str, finished: list[dict], out_dir: Path):
    """Keep what the finished strategies measured, say what happened last, and end as the signal would have."""
    from zero_kit.bench.report import write_outputs

    what = "stopped by Ctrl-C (SIGINT)" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    kept = "no strategy had finished"
    if finished:
        write_outputs(finished, out_dir)
        kept = f"results of the {len(finished)} finished strateg{'y' if len(finished) == 1 else 'ies'} in {out_dir}"
    warn(f"zero-kit bench: {what} during {running}, exit {128 + signum}; {kept}")
    raise SystemExit(128 + signum)

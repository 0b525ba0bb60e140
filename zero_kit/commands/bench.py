"""`zero-kit bench`: DDP, FSDP2 and ZeRO-0..3 with real launches (torchrun / deepspeed), same model, data, seed
and batch; writes results.jsonl, table.md and PNG plots to --out. Heavy imports happen inside `run`."""

from __future__ import annotations

import argparse
import sys

from zero_kit.options import add_dataclass_arguments, dataclass_from_args, options_to_argv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from zero_kit.bench import BenchOptions
    from zero_kit.launch import add_slurm_arguments

    add_dataclass_arguments(parser, BenchOptions)
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="write an sbatch script (-o FILE) that runs every strategy in one allocation of --nodes nodes with"
        " --gpus-per-node ranks each, one after another, into one results directory (--out)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="where --slurm writes the sbatch script")
    parser.add_argument(
        "--force", action="store_true", help="let --out or -o write over a directory or file zero-kit did not write"
    )
    add_slurm_arguments(parser, "bench")
    parser.add_argument(
        "--report",
        metavar="DIR",
        help="only re-render table.md and the plots of DIR from its results.jsonl (runs gathered elsewhere)",
    )


def _progress(line: str) -> None:
    # One status line rewritten in place on a terminal; plain lines in logs and CI.
    if sys.stderr.isatty():
        print(f"\r\033[K{line}", end="" if " step " in line else "\n", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from zero_kit.bench import BenchOptions, run_bench
    from zero_kit.errors import UserError

    if args.report:
        return _report(args.report)
    from zero_kit.launch.ops import use_extensions_dir

    use_extensions_dir()  # before any rank starts: they inherit it (hostfile ranks through the env file)
    opts = dataclass_from_args(BenchOptions, args)
    if opts.nproc < 1 or opts.steps <= opts.warmup:
        raise UserError(
            f"need --nproc >= 1 and --steps > --warmup, got --nproc {opts.nproc}, --steps {opts.steps},"
            f" --warmup {opts.warmup}",
            "e.g. --nproc 2 --steps 20 --warmup 3",
        )
    from zero_kit.bench.options import parse_zero_override

    parse_zero_override(opts.zero_override)  # refused before any launch, as the ranks will read it
    _check_last_port(opts)
    _check_outputs(args, opts.out)
    if args.slurm:
        if opts.ds_config:  # without --slurm, run_bench checks it before its first launch
            from zero_kit.bench.user_config import check_user_config

            per_node = opts.gpus_per_node or opts.nproc
            check_user_config(opts, (opts.nodes or 1) * per_node, per_node, None)
        return _write_sbatch(args, opts)
    records = run_bench(opts, progress=_progress)
    with open(f"{opts.out}/table.md", encoding="utf-8") as table:
        print(table.read())
    failed = [r["strategy"] for r in records if r.get("failed")]
    if failed:
        print(f"zero-kit bench: failed: {', '.join(failed)} (logs in {opts.out}/logs)", file=sys.stderr)
    return 1 if failed else 0


def _check_last_port(opts) -> None:
    """Run i meets on --master-port + i: the last run's port must be a port too (argparse checked the first)."""
    from zero_kit.bench.options import strategy_names
    from zero_kit.errors import UserError
    from zero_kit.options import PORTS

    runs = len(strategy_names(opts)) + (1 if opts.ds_config else 0)
    last = opts.master_port + runs - 1
    if last not in PORTS:
        raise UserError(
            f"--master-port {opts.master_port}: run {runs} of this bench would meet on port {last}, above 65535"
            " (run i meets on --master-port + i)",
            f"pass --master-port {PORTS.stop - runs} or lower",
        )


def _is_bench_out(path) -> bool:
    """The mark of a `zero-kit bench --out` directory: its results.jsonl or logs/ (a run cut short has only logs)."""
    return (path / "results.jsonl").is_file() or (path / "logs").is_dir()


def _is_bench_script(path) -> bool:
    """The mark of `bench --slurm -o`: our sbatch head and the driver line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return False
    return text.startswith("#!/bin/bash\n#SBATCH --job-name=") and "zero_kit.cli bench" in text


def _check_outputs(args: argparse.Namespace, out: str) -> None:
    """Before a rank starts: --out can hold the results and holds nothing of the user's; so for -o."""
    from zero_kit.errors import UserError, check_writable_dir, check_writable_file, refuse_overwrite

    if not args.slurm:  # with --slurm, --out is a path on the cluster, written there
        check_writable_dir(out, "--out")
        refuse_overwrite(out, "--out", args.force, _is_bench_out)
    if args.output and not args.slurm:  # a user who meant --out would look for results where none were written
        raise UserError(
            f"-o/--output {args.output}: that is where --slurm writes its sbatch script, and this run has no --slurm",
            f"results go to --out (default bench_out): pass --out {args.output}, or add --slurm",
        )
    if args.output:
        check_writable_file(args.output, "-o")
        refuse_overwrite(args.output, "-o", args.force, _is_bench_script)


def _write_sbatch(args: argparse.Namespace, opts) -> int:
    """The sbatch script: the same bench, run by the driver inside the allocation (it launches with srun)."""
    from zero_kit.errors import UserError, write_text
    from zero_kit.launch import SlurmJob, bench_sbatch_script

    if not args.output or not opts.nodes or not opts.gpus_per_node or opts.hostfile:
        raise UserError(
            "--slurm needs -o FILE, --nodes N and --gpus-per-node G (and no --hostfile)",
            "e.g. zero-kit bench --slurm --nodes 2 --gpus-per-node 8 --out bench_out -o bench.sbatch",
        )
    job = SlurmJob(nodes=opts.nodes, gpus_per_node=opts.gpus_per_node, launcher="deepspeed", module="zero_kit.cli",
                   args=(), job_name=args.job_name, time=args.time, partition=args.partition)  # fmt: skip
    bench_args = options_to_argv(opts, drop=("nodes",))
    write_text(args.output, bench_sbatch_script(job, bench_args), "-o")
    print(f"wrote {args.output}: sbatch --wait {args.output}, results in {opts.out}/", file=sys.stderr)
    return 0


REPORT_FIX = "point --report at the --out directory of a zero-kit bench run"


def _report(directory: str) -> int:
    import json
    from pathlib import Path

    from zero_kit.bench.report import write_outputs
    from zero_kit.errors import UserError

    path = Path(directory) / "results.jsonl"
    try:
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as err:
        raise UserError(f"--report {directory}: cannot read {path} ({err.strerror or err})", REPORT_FIX) from None
    except ValueError as err:  # not UTF-8, or a line that is not JSON
        raise UserError(f"--report {directory}: {path} is not a results.jsonl ({err})", REPORT_FIX) from None
    if not all(isinstance(record, dict) for record in records):
        raise UserError(f"--report {directory}: {path} holds lines that are not records", REPORT_FIX)
    write_outputs(records, Path(directory))
    print((Path(directory) / "table.md").read_text(encoding="utf-8"))
    return 0

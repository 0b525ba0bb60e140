"""Check first, then act (issue 30): every input of `zero-kit train` that can be checked in a second is checked
in the parent process, before the relaunch, an op build, the model load or any deletion under --output. A
wrong --data, --model, --output, --hostfile, --ds-config or --resume costs the user a second and changes nothing
on disk; the ranks would find the same mistakes only after half a minute of start-up.

What is read: the first rows of --data (zero_kit.data.files.peek_source; each data file of a directory) checked
against --format without a tokenizer, --model's config.json and the names of its weights (guards.model_files: the
files are there, and --lora-targets names modules the model has), one probe file created and deleted in --output's
nearest existing directory, --nvme-path, the hostfile, --master-port on this host, the --ds-config file's JSON
syntax and the --resume path (a Hub id's config.json from the Hugging Face cache). Nothing is created."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zero_kit.errors import UserError, check_writable_dir, raise_all, read_text
from zero_kit.train.options import TrainOptions

RESUME_WORDS = ("auto", "never")


def check_inputs(opts: TrainOptions, *, output: bool = True) -> None:
    """Every cheap input check of a run, all problems reported at once (each with its fix), before any heavy import
    (issue 23: an unwritable --output cost half a minute of imports and accelerate's warnings before preflight
    said so). output=False leaves --output to preflight alone, which checks it again with the disk space, the NVMe
    paths and the host's RAM."""
    problems: list[UserError] = []
    checks = (
        _check_data,
        _check_eval_data,
        _check_data_cache,
        _check_val_size,
        _check_trackers,
        _check_method,
        _check_sp,
        _check_model,
        _check_max_length,
        _check_output,
        _check_nvme_path,
        _check_hostfile,
        _check_master_port,
        _check_ds_config,
        _check_resume,
    )
    for check in checks if output else [c for c in checks if c is not _check_output]:
        try:
            check(opts)
        except UserError as err:
            problems.append(err)
    raise_all(problems, "in the inputs of zero-kit train")


def _check_data(opts: TrainOptions) -> None:
    if opts.data is not None:  # else the bundled dataset of --format
        _check_rows("--data", opts.data, opts)


def _check_eval_data(opts: TrainOptions) -> None:
    if opts.eval_data is not None:
        _check_rows("--eval-data", opts.eval_data, opts)


def _check_data_cache(opts: TrainOptions) -> None:
    from zero_kit.train.rundata import cache_dir

    check_writable_dir(cache_dir(opts), "--data-cache")


def _check_val_size(opts: TrainOptions) -> None:
    """A split that leaves no training rows, where the row count is cheap to know (the ranks check it anyway)."""
    from zero_kit.data.dataset import held_out
    from zero_kit.data.files import count_rows
    from zero_kit.train.rundata import specs

    if opts.val_size is None or not 0 < opts.val_size < 1:
        return  # none asked, or check_options said it
    try:
        count = count_rows(specs(opts)[0].paths[0])  # --data, or the bundled data of --format (or of --method dpo)
    except UserError:
        return  # _check_data names what is wrong with the file
    if count is not None:
        held_out(count, opts.val_size, opts.seed)


def _check_trackers(opts: TrainOptions) -> None:
    """Each --report-to tracker's package, before any work (the HF Trainer would fail on every rank after the model
    load). TensorBoard: the HF callback writes through torch.utils.tensorboard (needs `tensorboard`) or tensorboardX."""
    import importlib.util

    from zero_kit.train.options import TRACKERS, report_targets

    packages = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",)}
    missing = [name for name in report_targets(opts.report_to) if name in TRACKERS
               and not any(importlib.util.find_spec(pkg) for pkg in packages[name])]  # fmt: skip
    if missing:
        names = ", ".join(packages[name][0] for name in missing)
        raise UserError(
            f"--report-to {','.join(missing)}: package not installed (in {sys.executable}): {names}",
            f"pip install {' '.join(packages[name][0] for name in missing)}, or drop {names} from --report-to",
        )


def _check_rows(flag: str, path: str, opts: TrainOptions) -> None:
    """Each file `path` reads (a directory: its data files, zero_kit.data.files.data_files)."""
    from zero_kit.data.files import data_files

    try:
        files = data_files(path)
    except UserError as err:
        raise UserError(f"{flag} {err.message}", err.fix) from None
    for file in files:
        _check_file_rows(flag, file, opts)


def _check_file_rows(flag: str, path: str, opts: TrainOptions) -> None:
    from zero_kit.data.files import peek_source
    from zero_kit.data.formats import FORMATS, BadRow, check_row

    try:
        source, columns_known = peek_source(path, skip_bad=opts.skip_bad)
    except UserError as err:
        raise UserError(f"{flag} {err.message}", err.fix) from None
    if opts.method == "dpo":  # preference pairs, whatever --format says
        _check_pair_rows(flag, source, columns_known, opts.skip_bad)
        return
    missing = [column for column in FORMATS[opts.format] if column not in source.columns]
    if columns_known and missing:
        raise UserError(
            f"{flag} {source.path}: missing column(s) {missing} needed by --format {opts.format}"
            f" (has {source.columns[:12]})",
            "rename the columns, or pass the right --format",
        )
    if opts.skip_bad:
        return  # bad rows are the run's to count and skip
    for index, row in enumerate(source.rows):
        try:
            check_row(row, opts.format)
        except BadRow as bad:
            raise UserError(
                f"{flag} {source.where(index)}: {bad.detail} (--format {opts.format})",
                "fix the row, pass the right --format, or use --skip-bad to skip and count such rows",
            ) from None


def _check_pair_rows(flag: str, source, columns_known: bool, skip_bad: bool) -> None:
    """--method dpo: the file's columns and first rows as preference pairs (zero_kit.data.preference; lengths need
    the tokenizer: the data's preparation says a pair too long, still before any rank starts)."""
    from zero_kit.data.formats import BadRow
    from zero_kit.data.preference import PAIR_FIELDS, check_pair

    missing = [column for column in PAIR_FIELDS if column not in source.columns]
    if columns_known and missing:
        raise UserError(f"{flag} {source.path}: missing column(s) {missing} needed by --method dpo (has "
                        f"{source.columns[:12]})", "give each row prompt, chosen and rejected")  # fmt: skip
    for index, row in enumerate([] if skip_bad else source.rows):
        try:
            check_pair(row)
        except BadRow as bad:
            raise UserError(f"{flag} {source.where(index)}: {bad.detail} (--method dpo)",
                            "fix the row, or use --skip-bad to skip and count such rows") from None  # fmt: skip


def _check_method(opts: TrainOptions) -> None:
    """--method dpo: TRL installed, in the tested range, knowing --dpo-loss (zero_kit.train.preference)."""
    from zero_kit.train.preference import check_trl

    check_trl(opts)


def _check_sp(opts: TrainOptions) -> None:
    """--sp N: the installed accelerate and transformers can run it (zero_kit.train.long_sequences)."""
    if opts.sp > 1:
        from zero_kit.train.long_sequences import check_sp_support

        check_sp_support()


def _check_model(opts: TrainOptions) -> None:
    from zero_kit.model import check_trusted, hub_config_file, hub_id
    from zero_kit.plan.shapes import shape_from_hf_config
    from zero_kit.train.guards.model_files import check_model_files

    if opts.model is None:  # the embedded tiny LLaMA: only --lora-targets to check
        check_model_files(opts, None)
        return
    path = Path(opts.model)
    repo = hub_id(opts.model)
    if repo is not None:  # org/name: its config.json from the cache; a download waits until every check passed
        cached = hub_config_file(repo, download=False)
        if cached is None:
            return
        path = cached.parent
    if not path.is_dir():
        raise UserError(f"--model {opts.model}: no such directory", "pass a local Hugging Face model directory")
    fix = "pass the directory written by save_pretrained (config.json, safetensors, tokenizer files)"
    if not (path / "config.json").is_file():
        raise UserError(f"--model {opts.model}: no config.json, so not a Hugging Face model directory", fix)
    try:
        config = json.loads(read_text(path / "config.json", "--model", "a model directory with a JSON config.json"))
    except ValueError as err:
        raise UserError(f"--model {path / 'config.json'}: not JSON ({err})", "fix or replace config.json") from None
    if not isinstance(config, dict):
        raise UserError(f"--model {path / 'config.json'}: not a JSON object", "fix or replace config.json")
    try:
        shape_from_hf_config(config)
    except UserError as err:  # an architecture of none of the supported families
        raise UserError(f"--model {path / 'config.json'}: {err.message}", "pass a LLaMA-style model") from None
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"--model {path / 'config.json'}: missing or bad key {err}", "fix config.json") from None
    check_trusted(str(path), opts.trust_remote_code)  # code of its own (auto_map): said first, whatever else is wrong
    if repo is None:  # a Hub id's weights are checked once its snapshot is resolved (train.parent)
        check_model_files(opts, path)  # its weights, and the modules --lora-targets names


def _check_max_length(opts: TrainOptions) -> None:
    """--max-length against the model's positions (zero_kit.train.guards.fit): a refusal here; RoPE scaling's warning is
    said once by the job."""
    from zero_kit.train.guards.fit import check_length

    check_length(opts)


def _check_output(opts: TrainOptions) -> None:
    from zero_kit.train.guards.output import check_output_is_ours

    check_writable_dir(opts.output, "--output")
    check_output_is_ours(opts)  # a user's files there: refused unless --overwrite-output


def _check_nvme_path(opts: TrainOptions) -> None:
    """--nvme-path beside --output (a --ds-config file's nvme_path is preflight's, once the file is read)."""
    from zero_kit.train.guards.preflight import check_nvme

    if opts.nvme_path and "nvme" in (opts.offload_optimizer, opts.offload_param):
        raise_all(check_nvme((("--nvme-path", opts.nvme_path),)), "with --nvme-path")


def _check_hostfile(opts: TrainOptions) -> None:
    from zero_kit.launch.hostfile import read_hostfile

    if opts.hostfile:
        read_hostfile(opts.hostfile)


def _check_master_port(opts: TrainOptions) -> None:
    """--master-port of a job this process starts on this host only (--nproc, or one process), which this host's
    rank 0 will listen on: taken, every rank would load the model and then fail with EADDRINUSE. Not with
    --hostfile: the rendezvous is then on the first host, whose ports this host cannot see (relaunch.py); not in a
    rank (a launcher's, or an srun task: rank 0 may hold the port already). Without --master-port a free port is
    taken."""
    import os

    from zero_kit.dist import port_in_use, slurm_to_torch_env, under_launcher

    if not opts.master_port or opts.hostfile or under_launcher({**os.environ, **slurm_to_torch_env(dict(os.environ))}):
        return
    if port_in_use(opts.master_port):
        raise UserError(f"--master-port {opts.master_port}: something on this host holds it already (another job?)",
                        "pass another --master-port, or leave it out to take a free one")  # fmt: skip


def _check_ds_config(opts: TrainOptions) -> None:
    """The file is there and is JSON as the HF Trainer reads it (strict), said with the other inputs; its rules are
    the plan's (zero_kit.train.plan lints it), still before any data is tokenized."""
    from zero_kit.lint import read_checked

    if opts.ds_config:
        read_text(opts.ds_config, "--ds-config", "a DeepSpeed JSON config (zero-kit config -o FILE writes one)")
        read_checked(opts.ds_config, "hf-trainer", "--ds-config")


def _check_resume(opts: TrainOptions) -> None:
    if opts.resume in RESUME_WORDS or not opts.resume:
        return
    if not Path(opts.resume).is_dir():
        raise UserError(
            f"--resume {opts.resume}: no such checkpoint directory",
            f"pass --resume auto, --resume never or an existing checkpoint directory (e.g. {opts.output}/checkpoint-N)",
        )

"""`zero-kit` command line. Each subcommand lives in `zero_kit.commands.<name>` with two functions,
`add_arguments(parser)` and `run(args) -> int`; heavy imports (torch, deepspeed) happen inside `run`
so that quick commands stay quick. Only this edge prints user errors and picks exit codes."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from zero_kit import __version__
from zero_kit.errors import UserError

COMMANDS = {
    "config": "write a DeepSpeed JSON config for ZeRO stage 0-3 (offload, precision, batch, buckets)",
    "validate": "lint DeepSpeed JSON configs before launch: every problem with key path, value and fix",
    "plan": "which ZeRO stage / offload / FSDP2 fits a model on given GPUs, and which is fastest",
    "train": "fine-tune a LLaMA-style model with the HF Trainer and DeepSpeed (full or LoRA)",
    "export": "ZeRO checkpoint -> plain Hugging Face safetensors directory (or LoRA adapter)",
    "bench": "compare DDP, FSDP2 and ZeRO-0..3 with real launches: tokens/s, memory, bytes, loss parity",
    "launch": "write the launch command, hostfile or SLURM sbatch script for multi-node runs",
    "ops": "build DeepSpeed's ops ahead of time (cluster image, login node) into the directory runs use",
}


WITHOUT_DEEPSPEED = {None, "config"}
"""What never imports DeepSpeed: `zero-kit config`, and the top-level `--help` and `--version` (tests/unit/
test_ds_config.py holds them to it)."""

TAKES_SCRIPT_ARGS = {"validate"}
"""Commands that take the arguments of the user's own script after `--` (as `args.script_args`)."""


def _drops_cpu_accelerator_notice(record) -> bool:
    """DeepSpeed warns "Setting accelerator to CPU. If you have GPU ..." each time it is imported on a host
    without a GPU (deepspeed/accelerator/real_accelerator.py). zero_kit's CPU runs are CPU on purpose and
    `zero-kit validate` runs on laptops, so the line is noise there; only that record is dropped, every other
    DeepSpeed message (also a wrong accelerator on a GPU host) still shows."""
    return not str(record.msg).startswith("Setting accelerator to CPU")


def quiet_cpu_accelerator_notice() -> None:
    """Install the filter on DeepSpeed's logger ("DeepSpeed", deepspeed/utils/logging.py); it must come before
    the first `import deepspeed`, which logs the notice. Idempotent. `logging` is imported here: `zero-kit config`
    and `--help` never import DeepSpeed and start faster without it."""
    import logging

    logger = logging.getLogger("DeepSpeed")
    if _drops_cpu_accelerator_notice not in logger.filters:
        logger.addFilter(_drops_cpu_accelerator_notice)


def _command_module(name: str):
    return importlib.import_module(f"zero_kit.commands.{name}")


USER_HELP = """DeepSpeed ZeRO for LLaMA-style models: write and lint DeepSpeed configs, plan which ZeRO stage and
offload fit your GPUs, fine-tune through the Hugging Face Trainer, and measure ZeRO against DDP and FSDP2."""

HELP_EPILOG = """start with:  zero-kit train --nproc 2 --stage 3   (the embedded tiny model, two CPU ranks)
each command: zero-kit COMMAND --help
guides:       README.md and docs/ (training, configs, planning, clusters) in the zero_kit repository"""


class Parser(argparse.ArgumentParser):
    """argparse with no prefix matching (`--max-step` is not `--max-steps`: a typo must not pick a flag) and a
    did-you-mean fix line under a usage error, in the `PROG: error: ...` / `  fix: ...` shape of every error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.known_flags: list[str] = []  # set by build_parser: the flags of the command being parsed
        # (action, dataclass, field) of zero_kit.options.add_dataclass_arguments: the help is the field's docstring,
        # read from the source only when this parser prints its help
        self.field_help: list[tuple[argparse.Action, type, str]] = []

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for every add_argument (to check the metavar), and argparse's formatter asks
        # shutil for the terminal's width: importing shutil (with bz2 and lzma) was 3 ms of `zero-kit config`'s
        # start. The same width (COLUMNS, else the terminal's, else 80; less argparse's 2), read through os.
        return self.formatter_class(prog=self.prog, width=_terminal_columns() - 2)

    def format_help(self) -> str:
        if self.field_help:  # the top-level help has none: it imports no dataclass machinery
            self._read_field_help()
        return super().format_help()

    def _read_field_help(self) -> None:
        from zero_kit.options import field_docs

        for action, cls, name in self.field_help:
            action.help = field_docs(cls).get(name, "") + (action.help or "")
        self.field_help.clear()

    def error(self, message: str):
        self.print_usage(sys.stderr)
        fix = suggestion(message, self.known_flags or self._flags()) or f"see {self.prog} --help"
        self.exit(2, f"{self.prog}: error: {message}\n  fix: {fix}\n")

    def _flags(self) -> list[str]:
        return [flag for action in self._actions for flag in action.option_strings]


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns without importing shutil."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def suggestion(message: str, flags: list[str]) -> str:
    """ "did you mean ..." for argparse's messages about an unknown flag or an invalid choice (difflib)."""
    import difflib

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        options = re.findall(r"'([^']*)'|([^\s,]+)", choice.group(2))
        names = [quoted or bare for quoted, bare in options]
        close = difflib.get_close_matches(choice.group(1), names, n=1, cutoff=0.5)
        return f"did you mean {close[0]!r}?" if close else ""
    if "unrecognized arguments:" not in message:
        return ""
    given = [word.split("=", 1)[0] for word in message.split(":", 1)[1].split() if word.startswith("-")]
    close = [(word, difflib.get_close_matches(word, flags, n=1, cutoff=0.6)) for word in given]
    return "; ".join(f"did you mean {found[0]} (not {word})?" for word, found in close if found)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, just that subcommand (keeps start-up fast); with `only=""`, every command
    without its arguments (the top-level help, `--version`, a mistyped command: no command module is imported)."""
    parser = Parser(
        prog="zero-kit", description=USER_HELP, epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"zero-kit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, summary in COMMANDS.items():
        if only and name != only:
            continue  # argparse's parsers are not free (gettext looks for catalogues per parser): the one needed
        p = sub.add_parser(name, help=summary, description=summary)
        if only in (None, name):
            _command_module(name).add_arguments(p)
            if only == name:  # the top parser reports a subcommand's unknown flags: suggest from that command's
                parser.known_flags = [flag for action in p._actions for flag in action.option_strings]
    return parser


def strip_local_rank(argv: list[str]) -> list[str]:
    """Drop the `--local_rank=N` (or `--local-rank N`) that launchers add anywhere in argv, even before the
    subcommand (`deepspeed -m zero_kit.cli train`), and hand it on as LOCAL_RANK, where everything else reads it."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in ("--local_rank", "--local-rank"):
            value = value if eq else next(args, "")
            if value.isdigit():
                os.environ.setdefault("LOCAL_RANK", value)
            continue
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = strip_local_rank(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    if only not in WITHOUT_DEEPSPEED:
        quiet_cpu_accelerator_notice()
    after_dashes = None
    if only in TAKES_SCRIPT_ARGS and "--" in argv:  # verbatim for someone else's parser: argparse never sees them
        argv, after_dashes = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = build_parser(only or "")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if after_dashes is not None:
        args.script_args = after_dashes
    try:
        args = _with_run_file(parser, argv, args)
        return int(_command_module(args.command).run(args) or 0)
    except UserError as err:
        print(f"zero-kit {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        # Ctrl-C before a run's ranks can stop on their own (start-up, an export). A terminal's Ctrl-C reaches a
        # rank twice (directly and forwarded by the supervisor): a second one must not cut this branch short.
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if _speaks_for_the_job():
            print(f"zero-kit {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def _with_run_file(parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace) -> argparse.Namespace:
    """`--config FILE` (train): the file's values become the command's defaults, then the command line is parsed
    again, so a flag given there wins over the file."""
    path = getattr(args, "config", None)
    if path is None:
        return args
    from zero_kit.train.options import read_run_file

    sub = next(a for a in parser._actions if a.dest == "command").choices[args.command]
    sub.set_defaults(**read_run_file(path, sub, args.command))
    return parser.parse_args(argv)


def _speaks_for_the_job() -> bool:
    """The one process that reports a Ctrl-C: not a rank a plain `zero-kit train` relaunched (its starting process
    holds the plan and says the last line), and only rank 0 of ranks another launcher started."""
    from zero_kit.train.plan import PLAN_ENV

    return not os.environ.get(PLAN_ENV) and os.environ.get("RANK", "0") == "0"


def console() -> None:
    """The `zero-kit` console script and `python -m zero_kit.cli` (what the launchers run on every rank)."""
    try:
        code = main()
    except SystemExit as done:  # argparse's usage errors
        code = 0 if done.code is None else done.code if isinstance(done.code, int) else 2
    except BrokenPipeError:  # output piped into `head` and friends, which stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        code = 0
    if "torch" in sys.modules:  # a rank (zero_kit.dist, socket and all, is no import for the quick commands)
        from zero_kit.dist import exit_rank, is_multi_rank_process

        if is_multi_rank_process():
            exit_rank(code)  # no interpreter teardown: see there
    sys.exit(code)


if __name__ == "__main__":
    console()

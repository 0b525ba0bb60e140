"""The arguments a user passes their own HF Trainer script, read the way the script reads them: transformers' own
`HfArgumentParser(TrainingArguments)`, so flag spellings, types, defaults and TrainingArguments' own checks are
transformers', never a copy. Arguments that are not TrainingArguments belong to the script and are ignored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zero_kit.errors import UserError


@dataclass(frozen=True)
class TrainerArguments:
    """The TrainingArguments a user's own script will get (parsed by transformers' HfArgumentParser in
    `parse_trainer_arguments`), as plain values: what the HF Trainer compares the config's fixed values with."""

    values: dict[str, Any]
    """TrainingArguments field -> value (given or transformers' default)."""
    flags: dict[str, str]
    """TrainingArguments field -> the flag as the user typed it (only the fields given)."""
    refused: str | None = None
    """TrainingArguments' own check refused the arguments on this machine (its message); values are then parsed only."""

    def flag(self, field: str) -> str:
        return self.flags.get(field, f"--{field}")


# The script's own --deepspeed: TrainingArguments would load that file (and set accelerate's environment); the
# config judged is the one given to zero-kit validate.
_DEEPSPEED_FLAGS = ("--deepspeed",)


def _without_deepspeed(argv: list[str]) -> tuple[list[str], str | None]:
    """`argv` without --deepspeed PATH (or --deepspeed=PATH), and the path."""
    out, path, args = [], None, iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in _DEEPSPEED_FLAGS:
            path = value if eq else next(args, None)
            continue
        out.append(arg)
    return out, path


def _parser():
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser(TrainingArguments)

    def refuse(message: str):
        raise UserError(f"the script arguments after --: {message}", "pass arguments your script's parser accepts")

    parser.error = refuse  # argparse reports bad values through error(), which would print usage and exit
    return parser


def _typed_flags(parser, argv: list[str]) -> dict[str, str]:
    """TrainingArguments field -> the flag as typed, for the fields `argv` sets."""
    actions = parser._option_string_actions  # argparse's own table of option strings
    flags = {}
    for arg in argv:
        name = arg.partition("=")[0]
        if name.startswith("--") and name in actions:
            flags[actions[name].dest] = name
    return flags


def _fields() -> tuple[str, ...]:
    """Every TrainingArguments field: rules_trainer hands them to transformers' own HfTrainerDeepSpeedConfig, which
    reads what the installed version compares (4.57 also fp16_backend, fp16_opt_level, warmup_ratio). Fields that
    are no flag (4.57's private `_n_gpu`) are not in the parsed arguments."""
    import dataclasses

    from transformers import TrainingArguments

    return tuple(f.name for f in dataclasses.fields(TrainingArguments))


def parse_trainer_arguments(argv: list[str]) -> tuple[TrainerArguments, list[str], str | None]:
    """The TrainingArguments `argv` gives, the arguments that are not TrainingArguments (ignored: the script's
    own), and the path of the script's own --deepspeed (None if not given). Raises UserError for a bad value."""
    argv, deepspeed_path = _without_deepspeed(argv)
    parser = _parser()
    refused = None
    try:
        # look_for_args_file=False: an `.args` file beside sys.argv[0] would be zero-kit's, not the script's
        (arguments, rest) = parser.parse_args_into_dataclasses(
            argv, return_remaining_strings=True, look_for_args_file=False
        )
        values = {name: getattr(arguments, name) for name in _fields()}
    except ValueError as err:  # TrainingArguments.__post_init__'s own checks (e.g. --bf16 without a GPU or --use_cpu)
        refused = str(err)
        namespace, rest = parser.parse_known_args(argv)
        values = {name: getattr(namespace, name) for name in _fields() if hasattr(namespace, name)}
    return TrainerArguments(values, _typed_flags(parser, argv), refused), list(rest), deepspeed_path

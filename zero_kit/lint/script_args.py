"""The arguments a user passes their own HF Trainer script, read the way the script reads them: transformers' own
`HfArgumentParser(TrainingArguments)`, so flag spellings, types, defaults and TrainingArguments' own checks are
transformers', never a copy. Arguments that are not TrainingArguments belong to the script and are ignored."""

from __future__ import annotations

from zero_kit.errors import UserError
from zero_kit.lint.problem import TrainerArguments

# The TrainingArguments fields the rules read (rules_trainer): what the Trainer compares with the config, use_cpu.
FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "auto_find_batch_size",
    "learning_rate",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "max_grad_norm",
    "fp16",
    "fp16_full_eval",
    "bf16",
    "bf16_full_eval",
    "max_steps",
    "warmup_steps",
    "use_cpu",
)
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
    """FIELDS, plus --warmup_ratio where TrainingArguments still has it (transformers 4.x: warmup_steps is an int and
    the ratio a field of its own; 5.x: a warmup_steps below 1 is the ratio)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return FIELDS + (("warmup_ratio",) if "warmup_ratio" in names else ())


def _warmup_follows_length(values: dict) -> bool:
    """Whether get_warmup_steps depends on the number of training steps: a ratio (5.x: 0 < warmup_steps < 1;
    4.x: warmup_steps 0 and warmup_ratio > 0). A warmup of 0 steps is 1 at any length."""
    steps, ratio = values["warmup_steps"], values.get("warmup_ratio") or 0
    return 0 < steps < 1 or (steps == 0 and ratio > 0)


def parse_trainer_arguments(argv: list[str]) -> tuple[TrainerArguments, list[str], str | None]:
    """The TrainingArguments `argv` gives, the arguments that are not TrainingArguments (ignored: the script's
    own), and the path of the script's own --deepspeed (None if not given). Raises UserError for a bad value."""
    from types import SimpleNamespace

    from transformers import TrainingArguments

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
        values = {name: getattr(namespace, name) for name in _fields()}
    # The steps the Trainer fills the scheduler with: num_training_steps is --max_steps, else it depends on the data;
    # warmup is TrainingArguments.get_warmup_steps of it, at least 1 (trainer_config_finalize).
    steps = values["max_steps"] if values["max_steps"] > 0 else None
    warmup = None
    if steps is not None or not _warmup_follows_length(values):
        warmup = max(1, TrainingArguments.get_warmup_steps(SimpleNamespace(**values), steps or 0))
    values.update(num_training_steps=steps, warmup_num_steps=warmup)
    return TrainerArguments(values, _typed_flags(parser, argv), refused), list(rest), deepspeed_path

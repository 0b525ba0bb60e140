"""The rules about a user's own HF Trainer script (`zero-kit validate CFG --for hf-trainer -- SCRIPT ARGS`).

1. Every fixed config value the Trainer compares with its TrainingArguments, computed by transformers' own
   HfTrainerDeepSpeedConfig (trainer_config_process, then trainer_config_finalize): its fill_match fills "auto" and
   records any other value that differs, and the Trainer stops on that list with "Please correct the following
   DeepSpeed config values that mismatch TrainingArguments values". The keys, the TrainingArguments values and the
   verdicts are the installed transformers' (they differ between 4.57 and 5.x); what the run alone knows (world size,
   dataset length) is varied to tell which values depend on it. Checked in tests/unit/test_validate_script.py.
2. The traps of a CPU run, reproduced on two CPU ranks in tests/dist/test_hf_cpu_traps.py: without use_cpu,
   accelerate picks no backend and counts one process; ACCELERATE_USE_CPU makes accelerate skip DeepSpeed.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from zero_kit.lint.problem import LintContext, Problem, lookup
from zero_kit.lint.script_args import TrainerArguments

STOP = "the HF Trainer stops at start-up on it (its config values 'mismatch TrainingArguments values')"
# Stand-ins for what only the run knows, two of each: a value the Trainer computes from one differs between them.
_WORLDS = (1, 2)
_STEPS = (1, 1_000_000_007)  # far apart, so that a warmup ratio above 1e-9 gives two warmups
_UNKNOWN = {
    "world": ("the world size", "--world-size N to zero-kit validate"),
    "steps": ("the dataset length (no --max_steps)", "--max_steps N"),
}
# transformers names these values "... (calculated)", not the TrainingArguments fields (script flags) behind them.
_CALCULATED = {
    "train_batch_size": (
        ("per_device_train_batch_size", "gradient_accumulation_steps"),
        "per_device_train_batch_size x gradient_accumulation_steps x world size",
    ),
    "num_training_steps": (("max_steps",), "--max_steps, else from the dataset length"),
    "warmup_steps": (("warmup_steps", "warmup_ratio"), "TrainingArguments.get_warmup_steps"),  # ratio: 4.x only
}


@dataclass(frozen=True)
class _Compared:
    """One fill_match call that must match: the config key, transformers' name and value for it, its verdict."""

    path: str
    named: str
    value: Any
    mismatch: bool


@functools.cache
def _recording_config() -> type:
    """transformers' HfTrainerDeepSpeedConfig, noting each compared key with its value and fill_match's verdict."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class Recording(HfTrainerDeepSpeedConfig):
        # A section or offload device of the wrong type, which its own rules report, must not crash this one: the
        # section counts as absent (as the old lookup did); the offload flag, unused here, stays False.
        def find_config_node(self, ds_key_long):
            try:
                node, key = super().find_config_node(ds_key_long)
            except AttributeError:
                node, key = None, ds_key_long.rpartition(".")[2]
            return (node if isinstance(node, dict) else None), key

        def set_stage_and_offload(self):
            try:
                super().set_stage_and_offload()
            except TypeError:
                self._offload = False

        def fill_match(self, ds_key_long, hf_val, hf_key=None, must_match=True):
            before = len(self.mismatches)
            super().fill_match(ds_key_long, hf_val, hf_key, must_match)
            if must_match:
                self.compared.append(
                    _Compared(ds_key_long, hf_key or ds_key_long, hf_val, len(self.mismatches) > before)
                )

    return Recording


@functools.cache
def _parsed_class() -> type:
    from transformers import TrainingArguments

    class Parsed(TrainingArguments):
        """The script's TrainingArguments (their values, not re-run through __post_init__) at a world size set here:
        TrainingArguments.world_size asks a process group."""

        world_size = None

    return Parsed


def _trainer_compares(config: dict, values: dict[str, Any], world: int, steps: int) -> dict[str, _Compared]:
    """What the Trainer compares at this world size and number of training steps, by config key, in its order."""
    import transformers.integrations.deepspeed as hf_deepspeed

    args = object.__new__(_parsed_class())
    args.__dict__.update(values, world_size=world)
    global_config = hf_deepspeed._hf_deepspeed_config_weak_ref  # HfDeepSpeedConfig() replaces this global
    hf = _recording_config()(copy.deepcopy(config))
    hf.compared = []
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=1))  # fills "auto" bucket sizes; compared with nothing
    try:
        # With --auto_find_batch_size the Trainer processes the config again with auto_find_batch_size=True before
        # finalizing (propagate_args_to_deepspeed), and only that second list of mismatches counts.
        hf.trainer_config_process(args, auto_find_batch_size=bool(values["auto_find_batch_size"]))
        hf.trainer_config_finalize(args, model, steps)
    except ValueError:
        pass  # the Trainer's stop: its list is recorded in hf.compared
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = global_config
    return {compared.path: compared for compared in hf.compared}


def trainer_rules(config: dict, context: LintContext) -> list[Problem]:
    """The script's mismatches and CPU traps; nothing without script arguments (`context.trainer_args`)."""
    script = context.trainer_args
    if script is None or context.target != "hf-trainer":
        return []
    return mismatches(config, script, context.world_size) + cpu_traps(script, context)


def mismatches(config: dict, script: TrainerArguments, world: int | None) -> list[Problem]:
    """Every value the Trainer stops on (errors), and every one it may stop on depending on what is unknown here."""
    max_steps = script.values["max_steps"]
    steps = max_steps if max_steps > 0 else None  # the Trainer's num_training_steps: --max_steps, else from the data
    base = _trainer_compares(config, script.values, world or _WORLDS[0], steps or _STEPS[0])
    varied = {}
    if world is None:
        varied["world"] = _trainer_compares(config, script.values, _WORLDS[1], steps or _STEPS[0])
    if steps is None:
        varied["steps"] = _trainer_compares(config, script.values, world or _WORLDS[0], _STEPS[1])
    problems = []
    for path, compared in base.items():
        found = lookup(config, path)
        other = {name: run.get(path, compared) for name, run in varied.items()}
        depends = [name for name, run in other.items() if run.value != compared.value]
        if depends and (compared.mismatch or any(other[name].mismatch for name in depends)):
            why, fix = _UNKNOWN[depends[0]]
            message = f"the HF Trainer compares it with {_named(compared.named)}, which depends on {why}, unknown here"
            fix = f'write "auto" (the Trainer fills it), or pass {fix} to check it'
            problems.append(Problem("warning", path, found, message, fix))
        elif compared.mismatch and not depends:
            fields = _fields(compared.named, script.values)
            source = _source(path, fields, script, world)
            message = f"{STOP}: TrainingArguments {_named(compared.named)} = {compared.value!r} ({source})"
            fix = f'write "auto" (the Trainer fills it from its arguments), or {_flag_fix(path, fields, found, script)}'
            problems.append(Problem("error", path, found, message, fix))
    return problems


def _fields(named: str, values: dict[str, Any]) -> tuple[str, ...]:
    """The TrainingArguments fields behind transformers' name for a value ("adam_beta1+adam_beta2", "fp16|...")."""
    names = re.findall(r"\w+", named)
    return tuple(f for f in _CALCULATED.get(names[0], (names,))[0] if f in values)


def _named(named: str) -> str:
    """transformers' name for a value, with how a calculated one is calculated."""
    name, _, _ = named.partition(" ")
    return f"{name} (calculated: {_CALCULATED[name][1]})" if name in _CALCULATED else named


def _source(path: str, fields: tuple[str, ...], script: TrainerArguments, world: int | None) -> str:
    """Where the Trainer's value comes from: the flags given, or their defaults."""
    if path == "train_batch_size":
        micro, accum = (script.values[f] for f in fields)
        return f"{micro} x {accum} x world size {world}"
    given = [f"{script.flags[f]} {script.values[f]}" for f in fields if f in script.flags]
    if given:
        return "given as " + " ".join(given).replace(" True", "")
    if not fields:
        return "computed by transformers"
    return "the default: the script passes no " + "/".join(script.flag(f) for f in fields)


def _flag_fix(path: str, fields: tuple[str, ...], found: Any, script: TrainerArguments) -> str:
    """The script arguments that give `found`."""
    flags = [script.flag(f) for f in fields]
    if path == "train_batch_size":
        return "remove train_batch_size (DeepSpeed derives it), or pass a batch size and accumulation that give it"
    if not flags:
        return "change the script arguments behind it"
    if isinstance(found, bool):
        if found:
            return f"pass {flags[0]} to the script"
        given = [script.flag(f) for f in fields if script.values[f] is True] or flags
        return f"drop {' and '.join(given)} from the script"
    if isinstance(found, list) and len(found) == len(flags) > 1:
        pairs = " ".join(f"{flag} {value}" for flag, value in zip(flags, found, strict=True))
        return f"pass {pairs} to the script"
    return f"pass {flags[0]} {found} to the script"


def cpu_traps(script: TrainerArguments, context: LintContext) -> list[Problem]:
    """What breaks a Trainer script on CPU ranks although DeepSpeed accepts the config."""
    problems = []
    if script.refused is not None:
        severity = "error" if context.device == "cpu" else "warning"
        where = "" if context.device == "cpu" else " on this machine (judge a GPU run on a GPU host)"
        message = f"transformers' TrainingArguments refuses the script arguments{where}: {script.refused}"
        problems.append(Problem(severity, "TrainingArguments", None, message, "change the script arguments it names"))
    if accelerate_use_cpu(context.accelerate_use_cpu):
        message = (
            "accelerate then builds its state with cpu=True and never selects DeepSpeed (AcceleratorState): the"
            " Trainer trains without DeepSpeed and ignores this config, silently"
        )
        fix = "unset ACCELERATE_USE_CPU; on a CPU host pass --use_cpu to the script instead (it keeps DeepSpeed)"
        problems.append(Problem("error", "ACCELERATE_USE_CPU", context.accelerate_use_cpu, message, fix))
    elif context.device == "cpu" and not script.values["use_cpu"]:
        message = (
            "on a host without CUDA, accelerate (inside TrainingArguments) picks no distributed backend unless"
            " use_cpu and counts one process: with train_batch_size DeepSpeed's batch check fails; without it every"
            " rank trains as rank 0 on the same batches and writes the same files, and exits 0"
        )
        fix = f"pass {script.flag('use_cpu')} to the script (TrainingArguments(use_cpu=True))"
        problems.append(Problem("error", "TrainingArguments.use_cpu", False, message, fix))
    return problems


def accelerate_use_cpu(value: str | None) -> bool:
    """Whether accelerate reads ACCELERATE_USE_CPU=`value` as set (its own parse_flag_from_env: str_to_bool)."""
    if value is None:
        return False
    from accelerate.utils.environment import str_to_bool

    try:
        return bool(str_to_bool(value))
    except ValueError:
        return False  # accelerate's parse_flag_from_env raises here; the run fails loudly, not silently

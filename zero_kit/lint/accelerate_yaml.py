"""An `accelerate launch --config_file` YAML, checked against what accelerate reads (`zero-kit validate
--accelerate-config FILE`), from accelerate's own code, not a copied list:

- E a top-level key that is no field of accelerate's `ClusterConfig`: `load_config_from_file` raises "had unknown
  keys" at launch.
- E a `deepspeed_config` key that is no option of accelerate's "DeepSpeed Arguments" (launch_command_parser):
  `_validate_launch_command` copies each key onto the parsed arguments, where nothing reads a misspelt one; the
  setting is lost without a word (zero3_init_flags for zero3_init_flag: ZeRO-3 then builds the whole model on
  every rank).
- E beside `deepspeed_config_file`, a key that accelerate's DeepSpeedPlugin refuses to mix with it
  (`_deepspeed_config_checks`: "When using `deepspeed_config_file`, the following accelerate config variables will
  be ignored"): the config file holds those values.
- E `deepspeed_config_file` that does not exist; a note when it is not the JSON being validated.
- E distributed_type DEEPSPEED without a deepspeed_config section; W `use_cpu: true` with it: the YAML key sets
  `args.use_cpu`, not `args.cpu`, so the DeepSpeed launcher runs as before and the ranks never see it.
- E a `parallelism_config` key that is no option of accelerate's "ParallelismConfig Arguments" (copied onto the
  launch arguments as deepspeed_config's are: a misspelt one is lost); its Ulysses settings (sp_size > 1) by
  `rules_ulysses.accelerate_sp_rules`: a sequence length sp does not divide, an attention implementation accelerate
  refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zero_kit.errors import UserError
from zero_kit.lint.problem import Problem, join
from zero_kit.lint.rules_ulysses import accelerate_sp_rules

# DeepSpeedPlugin._deepspeed_config_checks' environment names, as the YAML keys that set them.
WITH_CONFIG_FILE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                    "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                    "zero3_save_16bit_model", "mixed_precision")  # fmt: skip


def read_yaml(path: str) -> dict:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"--accelerate-config {path}: cannot read it ({err.strerror})", "pass the YAML") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"--accelerate-config {path}:{where} not YAML ({err})", "fix the YAML") from None
    if not isinstance(data, dict):
        raise UserError(f"--accelerate-config {path}: not a mapping of keys", "pass an accelerate config YAML")
    return data


def _accelerate_reads() -> tuple[set[str], set[str], set[str]]:
    """(ClusterConfig's fields, the DeepSpeed options of `accelerate launch`, its ParallelismConfig options), from the
    installed accelerate."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    groups = {g.title: {a.dest for a in g._group_actions} for g in launch_command_parser()._action_groups}
    return set(ClusterConfig.__dataclass_fields__), groups["DeepSpeed Arguments"], groups["ParallelismConfig Arguments"]


def _close(key: str, known: set[str]) -> str:
    import difflib

    near = difflib.get_close_matches(key, sorted(known), n=1)
    return f"did you mean {near[0]!r}? " if near else ""


def check_accelerate_yaml(data: dict[str, Any], judged: list[str]) -> tuple[list[Problem], list[str]]:
    """The problems of one accelerate YAML, and notes. A relative deepspeed_config_file is read from the current
    directory, as `accelerate launch` reads it. `judged`: the JSON files being validated beside it."""
    fields, deepspeed_keys, parallelism_keys = _accelerate_reads()
    problems, notes = [], []
    for key in sorted(set(data) - fields):
        problems.append(Problem("error", join("", key), data[key], "accelerate refuses an unknown key at launch",
                                f"{_close(key, fields)}remove it"))  # fmt: skip
    section = data.get("deepspeed_config")
    uses_deepspeed = str(data.get("distributed_type", "")).upper() == "DEEPSPEED"
    if uses_deepspeed and not isinstance(section, dict):
        problems.append(Problem("error", "deepspeed_config", section, "distributed_type DEEPSPEED without it",
                                "add deepspeed_config: {deepspeed_config_file: ds.json} (zero-kit config"
                                " --accelerate-yaml writes one)"))  # fmt: skip
    if uses_deepspeed and data.get("use_cpu") is True:
        problems.append(Problem("warning", "use_cpu", True, "accelerate's DeepSpeed launcher does not pass it to the"
                                " ranks: it changes nothing (ACCELERATE_USE_CPU, set by hand, would turn DeepSpeed"
                                " off)", "remove it; on a CPU-only host the script gives accelerate a gloo process"
                                " group (docs/own_script.md)"))  # fmt: skip
    parallelism = data.get("parallelism_config")
    if isinstance(parallelism, dict):
        problems += _lost_keys(parallelism, "parallelism_config", parallelism_keys)
        problems += accelerate_sp_rules(parallelism)
    if not isinstance(section, dict):
        return problems, notes
    problems += _lost_keys(section, "deepspeed_config", deepspeed_keys)
    config_file = section.get("deepspeed_config_file")
    if config_file:
        for key in (k for k in WITH_CONFIG_FILE if k in section):
            problems.append(Problem("error", join("deepspeed_config", key), section[key],
                                    "accelerate's DeepSpeedPlugin refuses it beside deepspeed_config_file"
                                    " (ValueError: the JSON holds this value)",
                                    "remove it here and set it in the JSON"))  # fmt: skip
        path = Path(str(config_file))
        if not path.is_file():
            problems.append(Problem("error", "deepspeed_config.deepspeed_config_file", config_file,
                                    "no such file", "point it at the DeepSpeed JSON (zero-kit config -o FILE)"))  # fmt: skip
        elif judged and all(path.resolve() != Path(j).resolve() for j in judged):
            notes.append(f"its deepspeed_config_file {config_file} is not the JSON judged here")
    return problems, notes


def _lost_keys(section: dict[str, Any], name: str, known: set[str]) -> list[Problem]:
    """The keys of a YAML section that accelerate copies onto its launch arguments, where nothing reads them."""
    return [Problem("error", join(name, key), section[key], "accelerate copies it onto its launch arguments, where"
                    " nothing reads it: the setting is silently lost", f"{_close(key, known)}remove it")
            for key in sorted(set(section) - known)]  # fmt: skip

"""Run files: `zero-kit train --config run.yaml`, the habit of LLaMA-Factory and axolotl users (one YAML file
describes a run and repeats it exactly).

- Keys are the command's flags without the leading `--`, in either spelling (`max-steps` or `max_steps`); values
  are checked by the flag's own type and choices; booleans are YAML booleans. Flags on the command line win.
- Every problem of the file is reported at once, each with FILE:LINE, before any work: an unknown key with a
  did-you-mean, a key given twice (YAML loaders keep the last one silently), a value of the wrong kind.
- Every run writes its effective options to OUTPUT/zero_kit_run.yaml, which `--config` accepts as it is.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

from zero_kit.errors import UserError, raise_all, read_text

EFFECTIVE = "zero_kit_run.yaml"
NOT_IN_FILES = {"help", "config", "local_rank"}
"""Flags a run file cannot set: --help, --config itself, the launcher's --local_rank."""
FIX = "keys are the flags of `zero-kit {command}` without the leading --; see `zero-kit {command} --help`"


def _loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that keeps each key's line and refuses a key given twice (yaml keeps the last silently)."""

    def mapping(loader, node, deep=False):
        loader.flatten_mapping(node)
        pairs, lines = {}, {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in pairs:
                raise UserError(f"line {key_node.start_mark.line + 1}: key {key!r} given twice (first on line "
                                f"{lines[key]})", "keep one of them")  # fmt: skip
            pairs[key] = loader.construct_object(value_node, deep=deep)
            lines[key] = key_node.start_mark.line + 1
        return _Lined(pairs, lines)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return StrictLoader


class _Lined(dict):
    """A mapping that remembers the line of each key."""

    def __init__(self, pairs: dict, lines: dict):
        super().__init__(pairs)
        self.lines = lines


def _parse(path: str, command: str) -> _Lined:
    import yaml

    text = read_text(path, "--config", "a YAML run file (keys: the flags of `zero-kit train`)")
    try:
        data = yaml.load(text, Loader=_loader())  # noqa: S506 (a SafeLoader subclass)
    except UserError as err:
        raise UserError(f"--config {path}: {err.message}", err.fix) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"--config {path}{where}: not valid YAML ({problem})", "fix the YAML syntax there") from None
    if data is None:
        return _Lined({}, {})
    if not isinstance(data, _Lined):
        raise UserError(f"--config {path}: the file holds a {type(data).__name__}, not a mapping of flags to values",
                        FIX.format(command=command) + ", e.g. `stage: 3`")  # fmt: skip
    return data


def settable_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The command's flags a run file may set, by dest."""
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_IN_FILES}


def _convert(action: argparse.Action, value: Any) -> Any:
    """The value as the flag would hold it; ValueError saying what was expected."""
    if isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ValueError("expected true or false")
        return value
    if value is None:
        return None
    if isinstance(value, (dict, list, bool)):
        kind = "mapping" if isinstance(value, dict) else type(value).__name__
        raise ValueError(f"expected one {getattr(action.type, '__name__', 'value')}, got a {kind}")
    converted = action.type(str(value)) if action.type else str(value)
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"expected one of {', '.join(map(str, action.choices))}")
    return converted


def read_run_file(path: str, parser: argparse.ArgumentParser, command: str) -> dict[str, Any]:
    """{dest: value} from the run file, every problem reported at once (UserError) before anything is set."""
    data = _parse(path, command)
    actions = settable_actions(parser)
    values: dict[str, Any] = {}
    problems: list[UserError] = []
    for key, value in data.items():
        where = f"--config {path}:{data.lines[key]}"
        dest = str(key).replace("-", "_")
        action = actions.get(dest)
        if action is None:
            close = difflib.get_close_matches(dest, list(actions), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(UserError(f"{where}: unknown key {key!r}", hint + FIX.format(command=command)))
            continue
        try:
            values[dest] = _convert(action, value)
        except (ValueError, TypeError) as err:
            flag = action.option_strings[0]
            problems.append(UserError(f"{where}: {key}: {value!r} is not a valid value for {flag} ({err})",
                                      f"see `zero-kit {command} --help` for {flag}"))  # fmt: skip
    raise_all(problems, f"in the run file {path}")
    return values


def run_file_text(opts: Any, command: str) -> str:
    """The effective options of a run as a run file: every field, in the flags' order, that `--config` reads back."""
    import dataclasses

    import yaml

    fields = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts) if f.init}
    head = (f"# The effective options of this run. Repeat it: zero-kit {command} --config THIS_FILE\n"
            "# (flags given on the command line win over the file).\n")  # fmt: skip
    return head + yaml.safe_dump(fields, sort_keys=False, default_flow_style=False)


def write_effective(opts: Any, output: Path, command: str = "train") -> Path:
    from zero_kit.train import checkpoint

    path = output / EFFECTIVE
    checkpoint.atomic_write_text(path, run_file_text(opts, command))
    return path

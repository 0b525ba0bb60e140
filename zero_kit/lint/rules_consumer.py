"""Each consumer's contract with the config's optimizer and scheduler sections, and with the CPU process group:
what the code that reads the config does with them (issue 37). What the script does comes from the context
(`client_optimizer`, `script_cpu_adam`, `script_process_group`: the flags of `zero-kit validate`, or its `--script`
read by lint.own_script); unknown, a rule that needs it warns only where one of the two answers fails.

- accelerate, a script that passes its own optimizer to `prepare()` (an own loop): E an "optimizer" section, E a
  "scheduler" section (accelerate/accelerator.py `_prepare_deepspeed` raises "You cannot specify an optimizer in
  the config file and in the code at the same time", and the same for a scheduler); unknown: W the section (the HF
  Trainer takes it, an own loop is refused). The HF Trainer takes either: with no section it builds its own
  optimizer from its arguments, and under ZeRO-Offload accelerate swaps that for DeepSpeedCPUAdam.
- accelerate on a CPU run, an own loop: a bare `Accelerator()` picks no process-group backend without a GPU
  (accelerate/state.py `_prepare_backend`), so every rank is "process 0 of 1": the data is not split and each rank
  trains alone. E when the script is read and gives no backend, W when it is not read. `Accelerator(cpu=True)` is
  no fix: it turns DeepSpeed off (`not cpu`), as `use_cpu: true` in the YAML does.
- plain deepspeed.initialize: W a section beside the script's own optimizer or scheduler (DeepSpeed uses the
  script's and ignores the section: engine `_configure_optimizer`, `_configure_lr_scheduler`); E no "optimizer"
  section when the script passes none (the engine then has no optimizer: nothing trains); W/E ZeRO-Offload with the
  script's own optimizer (`_configure_optimizer` raises ZeRORuntimeException unless it is DeepSpeedCPUAdam or
  "zero_force_ds_cpu_optimizer" is false): E when the script is read and builds no DeepSpeedCPUAdam.
"""

from __future__ import annotations

from typing import Any

from zero_kit.lint.problem import ROOT, LintContext, Problem

OWN_LOOP_DOC = "docs/own_script.md, 'Your own training loop'"
CPU_LINE = 'Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")]) on a host without CUDA'


def consumer_rules(config: dict, context: LintContext) -> list[Problem]:
    if context.target == "accelerate":
        return _accelerate(config, context)
    if context.target == "deepspeed":
        return _deepspeed(config, context)
    return []


def _accelerate(config: dict, context: LintContext) -> list[Problem]:
    own, problems = context.client_optimizer, []
    for section, dummy in (("optimizer", "DummyOptim"), ("scheduler", "DummyScheduler")):
        if section not in config or own is False:
            continue
        refused = f"accelerate refuses a config {section} beside the {section} your script passes to prepare()"
        if own:
            fix = (f'remove the "{section}" section (zero-kit config --accelerate-yaml leaves it out), or pass'
                   f" accelerate.utils.{dummy} to prepare()")  # fmt: skip
            problems.append(Problem("error", section, config[section], refused + " (ValueError at prepare)", fix))
        elif section == "optimizer":
            fix = ("own loop: remove the section (zero-kit config --client-optimizer); a Trainer script: pass"
                   " --no-client-optimizer (or --script FILE) to validate")  # fmt: skip
            problems.append(Problem("warning", section, config[section], refused + "; an HF Trainer takes it", fix))
    if own and context.device == "cpu" and not context.script_process_group:
        severity = "error" if context.script_process_group is False else "warning"
        problems.append(Problem(severity, ROOT, None,
                                "an own accelerate loop on a CPU-only host: a bare Accelerator() picks no process"
                                " group under DeepSpeed, so every rank trains as process 0 of 1 on the same data",
                                f"build it as {CPU_LINE} ({OWN_LOOP_DOC})"))  # fmt: skip
    return problems


def _offloads_optimizer(config: dict) -> bool:
    zero = config.get("zero_optimization")
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    return isinstance(offload, dict) and offload.get("device") in ("cpu", "nvme")


def _deepspeed(config: dict, context: LintContext) -> list[Problem]:
    own, problems = context.client_optimizer, []
    if own:
        for section in ("optimizer", "scheduler"):
            if section in config:
                problems.append(Problem("warning", section, config[section],
                                        f"deepspeed.initialize uses the {section} your script passes and ignores this"
                                        " section", f'remove the "{section}" section (zero-kit config '
                                        "--client-optimizer), or stop passing your own to use it"))  # fmt: skip
    elif own is False and "optimizer" not in config:
        problems.append(Problem("error", "optimizer", None,
                                "your script passes no optimizer to deepspeed.initialize and the config has none:"
                                " the engine builds no optimizer and training changes nothing",
                                'add an "optimizer" section (zero-kit config writes AdamW unless --client-optimizer),'
                                " or pass optimizer= to deepspeed.initialize"))  # fmt: skip
    problems += _offload_with_client_optimizer(config, context)
    return problems


def _offload_with_client_optimizer(config: dict, context: LintContext) -> list[Problem]:
    own, section = context.client_optimizer, "optimizer" in config
    if not _offloads_optimizer(config) or config.get("zero_force_ds_cpu_optimizer", True) is False:
        return []
    if own is False or (own is None and section) or context.script_cpu_adam:
        return []
    known = own and context.script_cpu_adam is False
    value: Any = config["zero_optimization"]["offload_optimizer"].get("device")
    return [
        Problem(
            "error" if known else "warning",
            "zero_optimization.offload_optimizer.device",
            value,
            "optimizer offload with the script's own optimizer: deepspeed.initialize raises ZeRORuntimeException"
            " unless it is DeepSpeedCPUAdam",
            "build deepspeed.ops.adam.DeepSpeedCPUAdam (as accelerate does for you), leave the optimizer to the"
            ' config\'s "optimizer" section, or set "zero_force_ds_cpu_optimizer": false (torch\'s optimizer on'
            " the CPU: slower)",
        )
    ]

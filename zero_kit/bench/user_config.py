"""A user's own DeepSpeed config in the bench (`zero-kit bench --ds-config FILE`): one more run beside --strategies,
in the same table, phases, parity column and plots, as the row `ds_config:<file stem>` (strategies.user_config_name).

Checked before any launch, each bad input one UserError naming the file and the key, with its fix: a missing or
unreadable file and bad JSON (the strict reader: line and column), "auto" values (the HF Trainer's), what the bench
cannot run (a parameter offload, the registry's answer; NVMe; optimizer offload without an optimizer section;
tensor_parallel, pipeline, sequence parallelism), a precision other than --precision's, then zero-kit's linter for
plain deepspeed at the run's ranks and device, on the config as it will run (`user_ds_config`: the bench's batch keys).

The driver writes the file as read into the run's launch folder (`launch_copy`: --out is shared by every host, the
file need not be); each rank makes the config it runs from there at its own device. The record's "ds_config" keeps
the path, the file's stage and offload, the config that ran, what the bench changed and where the file trains
otherwise than the bench's strategies (`differences`), so `zero-kit bench --report DIR` re-renders without the file
and predicts its bytes from the file's stage (`record_info`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zero_kit.bench.options import BenchOptions
from zero_kit.errors import UserError, raise_all
from zero_kit.strategies import StrategyInfo, is_user_config, strategy_info, user_config_info, user_config_name

FLAG = "--ds-config"


@dataclass(frozen=True)
class UserConfig:
    name: str
    """Its row: ds_config:<file stem>."""
    path: str
    """The file as given."""
    config: dict[str, Any]
    """The file as written (read strictly, checked)."""
    info: StrategyInfo
    """Its registry entry (user_config_info): the file's stage and offload."""

    def entry(self, ran: dict[str, Any], changes: list[str], opts: BenchOptions) -> dict[str, Any]:
        """The record's "ds_config": what `record_info` and the table's notes read back."""
        return {"file": self.path, **facts(self.config), "config": ran, "changes": changes,
                "differs_from_bench": differences(self.config, opts)}  # fmt: skip


def facts(config: dict[str, Any]) -> dict[str, Any]:
    """The file's ZeRO stage, offload, bf16 states and hpZ, as user_config_info takes them (defaults where absent)."""
    zero = _section(config, "zero_optimization")
    stage = zero.get("stage", 0)

    def offloaded(key: str) -> bool:
        return _section(zero, key).get("device") in ("cpu", "nvme")

    bf16 = _section(config, "bf16") or _section(config, "bfloat16")
    hpz = zero.get("zero_hpz_partition_size")
    return {
        "stage": stage if isinstance(stage, int) and not isinstance(stage, bool) else 0,
        "offload_optimizer": offloaded("offload_optimizer"),
        "offload_param": offloaded("offload_param"),
        "low_precision_states": all(
            bf16.get(k) is True for k in ("bf16_master_weights_and_grads", "bf16_optimizer_states")
        ),  # fmt: skip
        "hpz": isinstance(hpz, int) and hpz > 1,
    }


def _section(config: Any, key: str) -> dict[str, Any]:
    node = config.get(key) if isinstance(config, dict) else None
    return node if isinstance(node, dict) else {}


def info_of(name: str, config: dict[str, Any]) -> StrategyInfo:
    return user_config_info(name, zero=_section(config, "zero_optimization"), **facts(config))


def record_info(record: dict[str, Any]) -> StrategyInfo | None:
    """The registry entry a record was run as: a named strategy's, or a user config's from the record's own
    "ds_config" (the file is not needed); None for a name this version does not know."""
    name, entry = record["strategy"], record.get("ds_config")
    if is_user_config(name) and isinstance(entry, dict):
        keys = ("stage", "offload_optimizer", "offload_param", "low_precision_states", "hpz")
        zero = _section(entry.get("config"), "zero_optimization")
        return user_config_info(name, zero=zero, **{k: entry[k] for k in keys if k in entry})
    return strategy_info(name)


def file_precision(config: dict[str, Any]) -> str | None:
    """fp32, bf16 or fp16 as the file's sections enable them; None when both are (the linter's error)."""
    bf16 = (_section(config, "bf16") or _section(config, "bfloat16")).get("enabled") is True
    fp16 = _section(config, "fp16").get("enabled") is True
    return None if bf16 and fp16 else "bf16" if bf16 else "fp16" if fp16 else "fp32"


def check_user_config(opts: BenchOptions, world_size: int, ranks_per_node: int, device: str | None) -> UserConfig:
    """The --ds-config file read and checked for a run of `world_size` ranks on `device` ("cpu", "cuda"; None:
    not judged, the ranks run elsewhere); UserError for the first kind of problem found."""
    from zero_kit.lint import LintContext, lint, read_checked, refuse_errors
    from zero_kit.strategies.deepspeed import user_ds_config

    path = str(opts.ds_config)
    config, read_problems = read_checked(path, "deepspeed", FLAG)
    if not isinstance(config, dict):
        raise UserError(f"{FLAG} {path}: a DeepSpeed config is a JSON object, not a {type(config).__name__}",
                        "wrap the settings in {...}")  # fmt: skip
    _refuse_autos(config, path)
    name = user_config_name(path)
    raise_all(_unsupported(config, path, info_of(name, config), opts.precision), f"in {FLAG} {path}")
    ran, _ = user_ds_config(config, _strategy_options(opts, world_size, device or "cpu"))
    context = LintContext(world_size=world_size, world_size_source="--nproc", target="deepspeed", device=device,
                          ranks_per_node=ranks_per_node, client_optimizer="optimizer" not in config)  # fmt: skip
    refuse_errors(path, read_problems + lint(ran, context), "deepspeed", FLAG)
    return UserConfig(name, path, config, info_of(name, config))


def _strategy_options(opts: BenchOptions, world_size: int, device: str):
    from zero_kit.strategies import StrategyOptions

    return StrategyOptions(precision=opts.precision, micro_batch=opts.micro_batch, grad_accum=opts.grad_accum,
                           world_size=world_size, device=device, lr=opts.lr, gradient_clipping=opts.gradient_clipping)  # fmt: skip


def _autos(node: Any, path: str) -> list[str]:
    from zero_kit.lint.problem import BATCH_KEYS, join  # replaced by the bench's (user_ds_config): "auto" is fine there

    if isinstance(node, dict):
        return [p for k, v in node.items() if not (path == "" and k in BATCH_KEYS) for p in _autos(v, join(path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _autos(v, join(path, i))]
    return [path] if node == "auto" else []


def _refuse_autos(config: dict[str, Any], path: str) -> None:
    autos = _autos(config, "")
    if autos:
        more = f" and {len(autos) - 3} more" if len(autos) > 3 else ""
        raise UserError(f'{FLAG} {path}: "auto" at {", ".join(autos[:3])}{more}: values the HF Trainer fills, and the'
                        " bench runs the file through plain deepspeed.initialize",
                        "use a config written without --hf-auto (zero-kit config --stage 2 --device cpu -o FILE),"
                        " or write numbers there")  # fmt: skip


def _unsupported(config: dict[str, Any], path: str, info: StrategyInfo, precision: str) -> list[UserError]:
    """What the bench cannot run of the file, each as one problem naming the key."""
    where, zero, problems = f"{FLAG} {path}:", _section(config, "zero_optimization"), []
    tp = _section(config, "tensor_parallel")
    size = tp.get("autotp_size", _section(tp, "tp").get("tp_size"))
    if isinstance(size, int) and size > 1:
        problems.append(UserError(f"{where} tensor_parallel.autotp_size {size}: the bench runs your config data"
                                  " parallel only", "remove the tensor_parallel section (AutoTP beside ZeRO-1 is"
                                  " --strategies zero1_tp)"))  # fmt: skip
    if config.get("pipeline"):
        problems.append(UserError(f"{where} a pipeline section: DeepSpeed pipelines need a PipelineModule, the bench"
                                  " trains a plain model", "remove the pipeline section (a 2-stage pipeline is"
                                  " --strategies pp)"))  # fmt: skip
    sequence = config.get("sequence_parallel_size")
    if isinstance(sequence, int) and sequence > 1:
        problems.append(UserError(f"{where} sequence_parallel_size {sequence}: the bench has no sequence parallelism",
                                  "remove sequence_parallel_size"))  # fmt: skip
    if not info.benchable:
        problems.append(UserError(f"{where} zero_optimization.offload_param: the bench cannot run a parameter"
                                  " offload (its DeepSpeed backend reads ZeRO-3's partitions on the device;"
                                  " `zero-kit plan` plans it)", "remove offload_param (offload_optimizer to cpu may"
                                  " stay)"))  # fmt: skip
    if _section(zero, "offload_optimizer").get("device") == "nvme":
        problems.append(UserError(f"{where} zero_optimization.offload_optimizer.device nvme: the bench offloads"
                                  " optimizer states to cpu only", 'set its device to "cpu", or remove the offload'))  # fmt: skip
    elif info.offload_optimizer and "optimizer" not in config:
        problems.append(UserError(f"{where} zero_optimization.offload_optimizer without an optimizer section:"
                                  " DeepSpeed steps offloaded states with its CPU Adam, built from that section",
                                  'add "optimizer": {"type": "AdamW", "params": {"lr": ...}}, or remove the'
                                  " offload"))  # fmt: skip
    ours = file_precision(config)
    if ours is not None and ours != precision:
        section = "bf16.enabled" if ours == "bf16" else "fp16.enabled" if ours == "fp16" else "no bf16/fp16 enabled"
        problems.append(UserError(f"{where} trains in {ours} ({section}) but the bench runs --precision {precision}:"
                                  " every strategy of one table trains at one precision",
                                  f"pass --precision {ours}, or change the file's precision to {precision}"))  # fmt: skip
    return problems


def differences(config: dict[str, Any], opts: BenchOptions) -> list[str]:
    """Where the file trains otherwise than the bench's strategies (their AdamW, --lr, --gradient-clipping, a constant
    learning rate, --precision's arithmetic): its losses then differ from DDP's by design."""
    from zero_kit.strategies.base import adamw_settings

    found = []
    optimizer = config.get("optimizer")
    if isinstance(optimizer, dict):
        kind = str(optimizer.get("type", "")).lower()
        params = _section(optimizer, "params")
        if kind not in ("adam", "adamw") or params.get("adam_w_mode") is False:
            found.append(f"optimizer {optimizer.get('type')!r}{' (adam_w_mode false)' * (kind == 'adam')}"
                         " (the bench's strategies: AdamW)")  # fmt: skip
        for key, ours in adamw_settings(opts.lr).items():
            given = params.get(key)
            ours = list(ours) if isinstance(ours, tuple) else ours
            if key in params and given != ours:
                found.append(f"optimizer {key} {json.dumps(given)} (the bench's AdamW: {json.dumps(ours)})")
            elif key not in params and key in ("lr", "weight_decay"):
                found.append(f"optimizer {key} not given: the optimizer's default (the bench's AdamW: {ours})")
    clipping = config.get("gradient_clipping", 0.0)
    if clipping != opts.gradient_clipping:
        found.append(f"gradient_clipping {json.dumps(clipping)} (--gradient-clipping {opts.gradient_clipping})")
    scheduler = config.get("scheduler")
    if scheduler is not None:
        kind = scheduler.get("type") if isinstance(scheduler, dict) else scheduler
        found.append(f"scheduler {kind!r}: the learning rate moves (the bench's strategies keep --lr)")
    if _section(config, "torch_autocast").get("enabled") is True:
        found.append("torch_autocast enabled: DeepSpeed computes under autocast")
    return found


def launch_copy(out: str | Path, name: str) -> Path:
    """Where the driver leaves the file as read for the ranks of `name`: its launch folder, beside its heartbeats."""
    return Path(out) / "logs" / f"{name}.launch" / "ds_config.json"


def write_launch_copy(user: UserConfig, out: str | Path) -> None:
    path = launch_copy(out, user.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"file": os.path.abspath(user.path), "config": user.config}), encoding="utf-8")


def read_launch_copy(opts: BenchOptions, name: str) -> UserConfig:
    """In a rank: the user's config the driver checked (launch_copy)."""
    saved = json.loads(launch_copy(opts.out, name).read_text(encoding="utf-8"))
    return UserConfig(name, saved["file"], saved["config"], info_of(name, saved["config"]))


def table_notes(records: list[dict[str, Any]]) -> list[str]:
    """Under the table: each user config's file, stage, what the bench changed, and where it trains otherwise."""
    lines = []
    for r in records:
        entry = r.get("ds_config")
        if not is_user_config(r["strategy"]) or not isinstance(entry, dict):
            continue
        offload = " + optimizer offload" if entry.get("offload_optimizer") else ""
        changes = "; ".join(entry.get("changes") or []) or "nothing"
        lines.append(f"{r['strategy']}: {entry.get('file')} (ZeRO-{entry.get('stage')}{offload}), run as written"
                     f" except: {changes}.")  # fmt: skip
        differs = entry.get("differs_from_bench") or []
        if differs:
            lines.append(f"{r['strategy']} trains otherwise than the bench's strategies, so its losses differ from"
                         f" DDP's by design: {'; '.join(differs)}.")  # fmt: skip
    return [""] + lines if lines else []

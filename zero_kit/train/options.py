"""Options of `zero-kit train`: one dataclass field per flag, the docstring under a field is its `--help`.

Pure data and pure helpers (no torch import), so `zero-kit train --help` stays fast and the Python
API (`zero_kit.hf.deepspeed_config`) takes exactly the same options as the CLI.

Run files: `zero-kit train --config run.yaml`, the habit of LLaMA-Factory and axolotl users (one YAML file
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from zero_kit.config.spec import ZeroOptions, ZeroSpec
from zero_kit.errors import UserError, raise_all, read_text
from zero_kit.model import DEFAULT_LORA_TARGETS
from zero_kit.options import Port


@dataclass(frozen=True)
class TrainOptions(ZeroOptions):
    model: str | None = None
    """Local Hugging Face model directory, or a Hub id (org/name) found in the Hugging Face cache; with
    HF_HUB_OFFLINE=0 in the environment a Hub id not in the cache is downloaded (zero-kit is offline otherwise).
    Families: LLaMA, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 (text), Phi-3. Default: the embedded tiny LLaMA."""
    trust_remote_code: bool = False
    """Let --model run Python code of its own directory (auto_map in config.json or tokenizer_config.json). Off: such
    a model is refused, since that code runs with your rights. Only for directories whose writers you trust."""
    data: str | None = None
    """Training data: a JSONL/JSON/CSV/Parquet file, a directory of them (each such file in it, in name order, as one
    dataset), or a saved `datasets` directory. Default: the bundled dataset."""
    format: Literal["alpaca", "chat", "text"] = "alpaca"
    """Row format: alpaca (instruction/input/output), chat (a `messages` list) or text (plain causal LM)."""
    max_length: int = 256
    """Maximum tokens per example (longer rows are errors, or skipped with --skip-bad)."""
    pack: bool = False
    """Pack short examples into full --max-length sequences (labels never cross example boundaries)."""
    skip_bad: bool = False
    """Skip (and count in the log) bad rows instead of stopping with an error naming file and row."""
    data_cache: str | None = None
    """Where the data is kept once tokenized (Arrow files every rank memory-maps; a second start with the same inputs
    skips the tokenizing). Default: $HF_DATASETS_CACHE/zero_kit (~/.cache/huggingface/datasets/zero_kit). A shared
    filesystem is fine: one process prepares, the others wait for it."""
    eval_data: str | None = None
    """Evaluation data (same kinds and --format as --data), tokenized, masked and packed as for training."""
    val_size: float | None = None
    """Hold out this fraction of --data (between 0 and 1) for evaluation: a fixed split chosen by --seed."""
    eval_steps: int | None = None
    """Evaluate every N optimizer steps (eval loss and perplexity); with eval data there is always one at the end."""
    keep_best: bool = False
    """Keep the checkpoint with the lowest eval loss out of --save-total-limit rotation and export it to final/
    (every save is evaluated first)."""
    report_to: str = "none"
    """Experiment trackers, comma-separated: none, tensorboard, wandb, mlflow (the HF Trainer's integrations; the
    package must be installed)."""
    run_name: str | None = None
    """Name of the run in the trackers (default: the tracker's own)."""
    ds_config: str | None = None
    """An existing DeepSpeed JSON config (linted for the HF Trainer first). Excludes --stage and the offload flags."""
    stage: Literal[0, 1, 2, 3] | None = None
    """ZeRO stage of the generated config (default 2): 1 shards optimizer state, 2 also gradients, 3 also parameters."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """Training precision. auto: what a --ds-config file enables, else bf16 on a GPU that supports it, else fp16 on
    GPU, fp32 on CPU."""
    micro_batch: int = 4
    """Examples per rank per forward pass (per_device_train_batch_size)."""
    grad_accum: int = 1
    """Micro batches accumulated before each optimizer step."""
    lr: float | None = None
    """Peak learning rate. Default: 1e-3 for the embedded tiny model, 2e-4 with LoRA, 2e-5 for full fine-tuning of --model."""
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    """Learning-rate schedule after warm-up."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    lora_r: int | None = None
    """LoRA rank: train low-rank adapters (peft) instead of all weights. Default: full fine-tuning."""
    lora_alpha: float | None = None
    """LoRA scaling alpha (default 2 x --lora-r)."""
    lora_targets: str | None = None
    """Comma-separated module names that get LoRA adapters. Default: the attention projections of the model's
    family (q_proj,k_proj,v_proj,o_proj; qkv_proj,o_proj for Phi-3)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute."""
    tiled_compute: bool = False
    """DeepSpeed's tiled compute for long sequences (ALST): each layer's MLP and the logits with the loss run over
    slices of the sequence, recomputed in backward, so neither the MLP's intermediate tensors nor the vocabulary-wide
    logits exist for the whole sequence at once. Costs one more forward of the MLPs and the output head."""
    sp: int = 1
    """Sequence parallelism (Ulysses, DeepSpeed's ALST through the HF Trainer): each sequence is split over N ranks,
    which exchange attention heads all-to-all, so activations per rank shrink about N-fold. The ranks must be a
    multiple of N; data-parallel ranks = ranks / N (each SP group trains the batches of its N ranks in turn)."""
    method: Literal["sft", "dpo"] = "sft"
    """sft: supervised fine-tuning on --format rows. dpo: preference tuning (TRL's DPOTrainer; pip install
    'zero_kit[dpo]') on prompt/chosen/rejected rows against a frozen reference model (with --lora-r: the base
    model, adapter off). Default data: a bundled preference set."""
    beta: float | None = None
    """DPO's beta: how far the trained model may move from the reference (higher: less far). Default 0.1."""
    dpo_loss: Literal["sigmoid", "hinge", "ipo", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
                      "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"] | None = None  # fmt: skip
    """TRL's DPO loss (its loss_type): sigmoid (the DPO paper's, the default), ipo, hinge, ...; the installed TRL
    must know it."""
    dpo_reference: Literal["auto", "model", "precompute"] = "auto"
    """DPO's reference log-probabilities: model (a frozen reference model runs forward every step; full fine-tuning
    holds a second copy of the weights), precompute (computed once before training, cached with the prepared data and
    reused by the next run on the same data and model; no reference in memory while training; TRL >= 1.9.0), or
    auto: precompute when the run reads every pair at least once, else model. The choice is printed."""
    output: str = "zero-kit-out"
    """Output directory: checkpoints, train_log.jsonl, and the exported model in final/. It must be new, empty, or
    one zero-kit wrote (see --overwrite-output)."""
    overwrite_output: bool = False
    """Go on in an --output that holds files zero-kit did not write: files at the names zero-kit writes are written
    over (final/, zero_kit_run.yaml, loss.png; train_log.jsonl is appended to); every other file is kept, never
    deleted."""
    max_steps: int | None = None
    """Optimizer steps to run (default: one pass over the data, see --epochs)."""
    epochs: float = 1.0
    """Passes over the data when --max-steps is not given."""
    save_steps: int | None = None
    """Write a DeepSpeed checkpoint every N optimizer steps (a final one is always written)."""
    save_total_limit: int | None = 2
    """Keep only the newest N complete checkpoints (older ones are deleted only after a newer one is complete)."""
    resume: str = "auto"
    """auto: continue from the newest complete checkpoint in --output if any; never: start fresh; or a checkpoint directory.
    A job Slurm requeued continues from its own newest complete checkpoint whatever this says."""
    export: bool = True
    """At the end, export a plain Hugging Face directory (or LoRA adapter) to OUTPUT/final."""
    export_diverged: bool = False
    """A run whose loss or gradient norm went NaN or infinite stops (exit 65) without a checkpoint of the wrecked
    weights or final/; with this flag it saves and exports them anyway (to look at them), and still exits 65."""
    nproc: int | None = None
    """When started plainly: re-launch under the `deepspeed` launcher with N ranks on this machine."""
    master_port: Port | None = None
    """Rendezvous port for --nproc (default: a free port) or --hostfile (default: 29500)."""
    hostfile: str | None = None
    """Hostfile ('HOST slots=N' per line): start the job on every host in it over pdsh/ssh with the deepspeed
    launcher (remote ranks get their environment through OUTPUT/.deepspeed_env). Run it on the first host."""
    seed: int = 0
    """Seed for model init, data order and dropout."""
    log_steps: int = 1
    """Log loss, learning rate and tokens/s every N optimizer steps."""
    collective_timeout: int = 600
    """Seconds a collective may wait before the job fails (a dead rank stops the job instead of hanging it)."""
    stall_timeout: float = 300
    """End the whole job (exit 76, a report naming each rank's last phase) when no rank has made progress for this
    many seconds; start-up, saves and the export may take 6x as long. 0 disables the watchdog."""
    verbose: bool = False
    """Show on the terminal what goes to OUTPUT/zero_kit.log only: the deepspeed launcher's own lines, and the
    libraries' deprecation warnings about each other's calls (nothing you can act on)."""
    memory_check: bool = True
    """Before any rank starts, check the planner's peak memory (per rank x ranks on this host on CPU, per GPU on
    a GPU) against what the machine has, and refuse a run that cannot fit with the flags that would fit.
    --no-memory-check runs anyway."""


def check_options(opts: TrainOptions) -> None:
    """Every contradiction between flags, collected and reported at once, each with its own fix."""
    problems = []
    generator_flags = opts.stage is not None or opts.offload_optimizer != "none" or opts.offload_param != "none"
    if opts.ds_config and generator_flags:
        problems.append(
            UserError(
                "--ds-config was given together with --stage/--offload-*: the file already decides those",
                "drop --stage/--offload-* (or --ds-config, to generate the config from the flags)",
            )
        )
    for name in ("micro_batch", "grad_accum", "max_length", "log_steps", "sp"):
        if getattr(opts, name) < 1:
            problems.append(_not_positive(name, getattr(opts, name)))
    for name in ("max_steps", "save_steps", "nproc", "lora_r", "save_total_limit"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            problems.append(_not_positive(name, value))
    if opts.lora_r is None and opts.lora_alpha is not None:
        problems.append(UserError("--lora-alpha was given without --lora-r", "add --lora-r R, or drop --lora-alpha"))
    if opts.resume in ("", None):
        problems.append(UserError("--resume is empty", "pass --resume auto, --resume never or --resume CHECKPOINT_DIR"))
    problems += _empty_paths(opts) + _range_problems(opts) + _eval_problems(opts) + _method_problems(opts)
    raise_all(problems + _sp_problems(opts), "in the flags")


def _sp_problems(opts: TrainOptions) -> list[UserError]:
    """--sp and --tiled-compute against the flags that cannot go with them (the world size:
    zero_kit.train.plan.plan_run)."""
    bad = []
    if opts.tiled_compute and opts.method == "dpo":  # TRL computes its log-probabilities from the logits itself
        bad.append(UserError("--tiled-compute with --method dpo: TRL's DPO loss needs the whole logits",
                             "drop --tiled-compute"))  # fmt: skip
    if opts.sp <= 1:
        return bad
    if opts.pack:  # SDPA's causal mask would span a packed row's documents once Ulysses gathers the sequence
        bad.append(UserError(f"--pack with --sp {opts.sp}: packed rows under sequence parallelism need flash "
                             "attention (a GPU); with SDPA, documents would attend across their boundaries",
                             "drop --pack (rows are padded to a multiple of --sp instead)"))  # fmt: skip
    if opts.method == "dpo":
        # TRL's DPOTrainer takes each sequence's log-probability on one rank: of accelerate's parallelism config it
        # reads the tensor-parallel size only (trl/trainer/dpo_trainer.py, 1.16)
        bad.append(UserError(f"--sp {opts.sp} with --method dpo: TRL's DPOTrainer does not split a sequence over "
                             "ranks (it has no sequence parallelism)", "drop --sp; for long pairs add "
                             "--activation-checkpointing, or give a shorter --max-length"))  # fmt: skip
    return bad


def _method_problems(opts: TrainOptions) -> list[UserError]:
    """--method dpo's flags (whether TRL is installed and knows --dpo-loss: zero_kit.train.guards.inputs)."""
    bad = []
    if opts.method != "dpo":
        chosen = (("--beta", opts.beta), ("--dpo-loss", opts.dpo_loss),
                  ("--dpo-reference", None if opts.dpo_reference == "auto" else opts.dpo_reference))  # fmt: skip
        given = [flag for flag, value in chosen if value is not None]
        if given:
            bad.append(UserError(f"{' and '.join(given)} given without --method dpo",
                                 f"add --method dpo, or drop {' and '.join(given)}"))  # fmt: skip
        return bad
    if opts.beta is not None and not opts.beta > 0:
        bad.append(UserError(f"--beta must be > 0, got {opts.beta:g}", "pass e.g. --beta 0.1, or leave it out"))
    if opts.pack:
        bad.append(UserError("--pack with --method dpo: TRL trains each pair as two whole sequences",
                             "drop --pack"))  # fmt: skip
    return bad


PATH_FLAGS = ("output", "data", "eval_data", "model", "ds_config", "hostfile", "data_cache", "nvme_path")
"""Flags that name a file or directory: given as an empty string, each would quietly mean another place."""


def _empty_paths(opts: TrainOptions) -> list[UserError]:
    """`--output ""` would train into the current directory, `--data ""` read it, `--ds-config ""` be ignored."""
    return [
        UserError(f"--{name.replace('_', '-')} is empty", f"name a path, or leave --{name.replace('_', '-')} out")
        for name in PATH_FLAGS
        if isinstance(getattr(opts, name, None), str) and not getattr(opts, name).strip()
    ]


def _range_problems(opts: TrainOptions) -> list[UserError]:
    """Values no run can use, said before any rank starts (HF's TrainingArguments or peft would say it later,
    on every rank, after the model load)."""
    bad = []
    if opts.max_steps is None and not opts.epochs > 0:
        bad.append(UserError(f"--epochs must be > 0, got {opts.epochs:g}", "pass --epochs 1, or --max-steps N"))
    if opts.warmup_steps < 0:
        bad.append(UserError(f"--warmup-steps must be >= 0, got {opts.warmup_steps}", "pass --warmup-steps 0 or more"))
    if opts.lr is not None and not opts.lr > 0:
        bad.append(UserError(f"--lr must be > 0, got {opts.lr:g}", "pass e.g. --lr 2e-5, or leave it out"))
    if not 0 <= opts.lora_dropout < 1:
        bad.append(
            UserError(f"--lora-dropout must be in [0, 1), got {opts.lora_dropout:g}", "e.g. --lora-dropout 0.05")
        )
    if opts.lora_r is not None and opts.lora_targets is not None and not opts.lora_targets.replace(",", "").strip():
        bad.append(
            UserError("--lora-targets is empty", f"pass module names, e.g. --lora-targets {DEFAULT_LORA_TARGETS}")
        )
    if opts.collective_timeout < 1:
        bad.append(_not_positive("collective_timeout", opts.collective_timeout))
    if opts.master_port is not None and not 1 <= opts.master_port <= 65535:  # the CLI's parser refuses it first
        bad.append(UserError(f"--master-port {opts.master_port}: a TCP port is 1..65535", "pass 1..65535, or none"))
    return bad


def _eval_problems(opts: TrainOptions) -> list[UserError]:
    """The evaluation and tracking flags among themselves (whether the files exist: zero_kit.train.guards.inputs)."""
    bad = []
    if opts.eval_data is not None and opts.val_size is not None:
        bad.append(UserError("--eval-data and --val-size were both given", "pass one of them: a file, or a split"))
    if opts.val_size is not None and not 0 < opts.val_size < 1:
        bad.append(UserError(f"--val-size must be between 0 and 1, got {opts.val_size:g}", "e.g. --val-size 0.05"))
    for flag, given in (("--eval-steps", opts.eval_steps is not None), ("--keep-best", opts.keep_best)):
        if given and not evaluates(opts):
            bad.append(
                UserError(f"{flag} was given without evaluation data", "add --eval-data FILE or --val-size 0.05")
            )
    if opts.keep_best and not opts.save_steps:
        bad.append(UserError("--keep-best was given without --save-steps: no checkpoint is written to keep",
                             "add --save-steps N (e.g. the --eval-steps value)"))  # fmt: skip
    if opts.eval_steps is not None and opts.eval_steps < 1:
        bad.append(_not_positive("eval_steps", opts.eval_steps))
    targets = report_targets(opts.report_to)
    unknown = [name for name in targets if name not in (*TRACKERS, "none")]
    if unknown or not targets:
        bad.append(UserError(f"--report-to {opts.report_to!r}: unknown {', '.join(unknown) or 'empty value'}",
                             f"pass none, or some of {', '.join(TRACKERS)} separated by commas"))  # fmt: skip
    elif "none" in targets and len(targets) > 1:
        bad.append(UserError(f"--report-to {opts.report_to}: none together with trackers", "drop none, or the rest"))
    return bad


TRACKERS = ("tensorboard", "wandb", "mlflow")
"""--report-to values: the HF Trainer integrations zero-kit tests (transformers' INTEGRATION_TO_CALLBACK names)."""


def report_targets(report_to: str) -> list[str]:
    """`tensorboard,wandb` -> ["tensorboard", "wandb"]; `none` stays (check_options refuses it beside others)."""
    return [name.strip() for name in report_to.split(",") if name.strip()]


def evaluates(opts: TrainOptions) -> bool:
    return opts.eval_data is not None or opts.val_size is not None


def _not_positive(name: str, value: int) -> UserError:
    flag = "--" + name.replace("_", "-")
    return UserError(f"{flag} must be >= 1, got {value}", f"pass {flag} 1 or more (zero-kit train --help)")


def zero_spec(opts: TrainOptions, device: str | None = None) -> ZeroSpec:
    """The generator's spec for `--stage` and friends; "auto" values are filled by the HF Trainer from our flags.
    `device`: the run's ("cuda" or "cpu"; None: a GPU is assumed), for what the generator decides by device."""
    return ZeroSpec(
        stage=2 if opts.stage is None else opts.stage,
        offload_optimizer=opts.offload_optimizer,
        offload_param=opts.offload_param,
        nvme_path=opts.nvme_path,
        hf_auto=True,
        gradient_clipping=opts.gradient_clipping,
        device=device or "cuda",
    )


def default_lr(opts: TrainOptions) -> float:
    if opts.lr is not None:
        return opts.lr
    if opts.lora_r is not None:
        return 2e-4
    return 1e-3 if opts.model is None else 2e-5


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
    from zero_kit.checkpoints import store

    path = output / EFFECTIVE
    store.atomic_write_text(path, run_file_text(opts, command))
    return path

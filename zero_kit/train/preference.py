"""Preference tuning in `zero-kit train --method dpo` (issue 49): TRL's DPOTrainer in place of the HF Trainer, with
the same run around it (plan, ZeRO stage, callbacks, checkpoints, resume, export). zero_kit writes no loss: TRL's
DPOTrainer computes it, its variants (--dpo-loss) and its figures (rewards, margins, accuracies).

The reference model:
- with --lora-r, none: TRL wraps the model with the adapter (peft_config) and takes the reference log-probabilities
  from the same model with the adapter switched off, the base as it was loaded;
- full fine-tuning: a second copy of the starting model, built like the trained one (the same directory, or the
  embedded model from the same seed; under ZeRO-3 inside zero.Init, so no rank ever holds all of it) and handed to
  TRL, which prepares it with DeepSpeed at the run's ZeRO-3 (its parameters partitioned like the trained model's;
  ZeRO-1/2 shard only optimizer states and gradients, which a frozen model has none of, so there TRL keeps a whole
  copy per rank, stage 0) and without an optimizer: it is only ever run forward, under no_grad, and never trained.

Or no reference model at all (--dpo-reference precompute, or auto on a run that reads every pair): TRL computes the
reference log-probabilities of every pair once before training (the starting model run forward through a DeepSpeed
inference engine, or with the adapter off) and caches them beside the prepared pairs; the next run on the same pairs
and the same starting model reads them back. zero_kit keys that cache by the model's identity (`reference_key`):
TRL's own key hashes the model's state_dict, which under ZeRO-3 holds only empty partitioned placeholders, so any
two models of one architecture would share an entry. TRL still computes that hash in its __init__ (every weight as
fp32 bytes through sha256, on every rank): zero-kit's key stands in for it there (`_keyed_by`).

The pairs were tokenized once by the starting process as TRL tokenizes them (zero_kit.data.preference): TRL's own
preparation is skipped for them. TRL is an optional dependency (`pip install 'zero_kit[dpo]'`): a run without it, or
with a release outside the tested range, is refused before any work (zero_kit.train.guards.inputs).
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zero_kit.errors import UserError
from zero_kit.log import say
from zero_kit.train.options import TrainOptions

INSTALL = "pip install 'zero_kit[dpo]'"
TRL_TESTED = (">=0.29.1", "<2")
"""The TRL releases CI tests (constraints/oldest.txt, constraints/newest.txt); setup.py's extra says the same."""
PRECOMPUTE_TRL = "1.9.0"
"""The first TRL whose reference precomputation runs under DeepSpeed (huggingface/trl#6403: before it, the model's
parameters were still on the host, or partitioned, when the precompute ran them)."""
DEFAULT_BETA = 0.1
DEFAULT_LOSS = "sigmoid"


def trl_version() -> str | None:
    """The installed TRL's version, None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return None


def check_trl(opts: TrainOptions) -> None:
    """--method dpo needs TRL, in the tested range, knowing --dpo-loss: said before any work, with the fix."""
    if opts.method != "dpo":
        return
    from packaging.specifiers import SpecifierSet

    found = trl_version()
    if found is None:
        raise UserError(f"--method dpo needs TRL, which is not installed (in {sys.executable})", INSTALL)
    tested = SpecifierSet(",".join(TRL_TESTED))
    if found not in tested:
        raise UserError(f"--method dpo: TRL {found} is installed, zero-kit is tested with TRL {tested}", INSTALL)
    if opts.dpo_reference == "precompute" and not precompute_supported(found):
        raise UserError(f"--dpo-reference precompute: TRL {found} cannot precompute reference log-probabilities "
                        f"under DeepSpeed (fixed in TRL {PRECOMPUTE_TRL})",
                        f"pip install 'trl>={PRECOMPUTE_TRL}', or pass --dpo-reference model")  # fmt: skip
    if opts.dpo_loss is None:  # the default, in every TRL of the tested range: no TRL import (seconds) to check it
        return
    loss = opts.dpo_loss
    known = trl_losses()
    if known and loss not in known:
        raise UserError(f"--dpo-loss {loss}: TRL {found} does not know it (it knows {', '.join(known)})",
                        f"pick one of those, or upgrade TRL ({INSTALL} -U)")  # fmt: skip


def precompute_supported(found: str | None) -> bool:
    from packaging.version import Version

    return found is not None and Version(found) >= Version(PRECOMPUTE_TRL)


@dataclass(frozen=True)
class ReferenceChoice:
    """How a DPO run gets its reference log-probabilities (--dpo-reference), and why."""

    precompute: bool
    reason: str


def choose_reference(opts: TrainOptions, pairs: int, pairs_per_step: int) -> ReferenceChoice:
    """--dpo-reference's choice. auto weighs time, as memory always favours precomputing (no reference held while
    training): precomputing runs the reference once over every pair before training; the model runs it over each
    pair a step reads. So precompute when the run reads every pair at least once (its cost is then no more than the
    forwards it replaces, and the next run on the same pairs and model pays nothing), else keep the model."""
    if opts.dpo_reference != "auto":
        given = f"--dpo-reference {opts.dpo_reference}"
        return ReferenceChoice(opts.dpo_reference == "precompute", given)
    if not precompute_supported(trl_version()):
        return ReferenceChoice(False, f"auto: TRL {trl_version()} cannot precompute under DeepSpeed "
                                      f"(TRL >= {PRECOMPUTE_TRL} can)")  # fmt: skip
    read = opts.max_steps * pairs_per_step if opts.max_steps else None
    if read is not None and read < pairs:
        return ReferenceChoice(False, f"auto: the run reads {read:,} of {pairs:,} pairs, so precomputing would run "
                                      "the reference over pairs it never trains on")  # fmt: skip
    times = f"{read / pairs:.1f}" if read is not None else f"{opts.epochs:g}"
    return ReferenceChoice(True, f"auto: the run reads every pair ({times} times), so one forward per pair before "
                                 "training costs no more than the per-step reference forwards it replaces")  # fmt: skip


def reference_key(opts: TrainOptions, args) -> str:
    """What the reference log-probabilities depend on besides the pairs (which TRL's key covers through the
    dataset's fingerprint): the starting model (the embedded one's shape and seed, or the model directory's files
    by name, size and modification time), its precision and the libraries that compute them."""
    import hashlib
    import json

    import torch
    import transformers

    if opts.model is None:
        from zero_kit.model import TINY_DEFAULTS, TINY_VOCAB

        model: object = {"embedded": {k: str(v) for k, v in TINY_DEFAULTS.items()}, "vocab": TINY_VOCAB,
                         "seed": opts.seed}  # fmt: skip
    else:
        root = Path(opts.model)
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        model = [[str(p.relative_to(root) if root.is_dir() else p), p.stat().st_size, p.stat().st_mtime_ns]
                 for p in files]  # fmt: skip
    material = {"model": model, "bf16": args.bf16, "fp16": args.fp16, "max_length": args.max_length,
                "versions": [torch.__version__, transformers.__version__, trl_version()]}  # fmt: skip
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def trl_losses() -> list[str]:
    """The loss types the installed TRL lists for DPOConfig.loss_type (its own help text names them)."""
    from trl.trainer.dpo_config import DPOConfig

    help_text = DPOConfig.__dataclass_fields__["loss_type"].metadata.get("help", "")
    return re.findall(r"'(\w+)'", help_text.split("If multiple")[0])


def arguments_class(opts: TrainOptions) -> type:
    """The Trainer's arguments class of the run: TRL's DPOConfig (a TrainingArguments) for --method dpo."""
    if opts.method == "dpo":
        from trl import DPOConfig

        return DPOConfig
    from transformers import TrainingArguments

    return TrainingArguments


def method_arguments(opts: TrainOptions, precompute: bool = False) -> dict[str, Any]:
    """DPOConfig's own arguments of the run (none for sft). max_length: every pair fits it (zero_kit.data.preference
    refused or skipped the others), so TRL's collator never cuts one. precompute: the run's `choose_reference`."""
    if opts.method != "dpo":
        return {}
    return {
        "beta": DEFAULT_BETA if opts.beta is None else opts.beta,
        "loss_type": [opts.dpo_loss or DEFAULT_LOSS],
        "max_length": opts.max_length,
        "precompute_ref_log_probs": precompute,
    }


def trainer_class(counting) -> type:
    """TRL's DPOTrainer for zero-kit's ranks; `counting`: zero_kit.train.callbacks.counting_trainer's class maker."""
    from trl import DPOTrainer

    from zero_kit.data.preference import ID_COLUMNS

    class PreparedPairsDPOTrainer(DPOTrainer):
        def __init__(self, *args, reference_key: str, **kwargs):
            self.zero_kit_precomputed: dict[str, dict] = {}  # what each precompute pass did (say_reference)
            with _keyed_by(reference_key):  # TRL keeps it as _precompute_model_hash, its precompute cache key
                super().__init__(*args, **kwargs)
            engine = getattr(self, "_precompute_engine", None)  # TRL >= 1.9: the precompute's inference engine
            if engine is not None:
                # TRL keeps it for a later evaluate(); at ZeRO-3 its parameter hooks stay on the trained model and
                # run beside the training engine's at every step (2 fetch and 2 release hooks per layer instead of
                # 1 each, checked in a probe). zero-kit's pairs, train and eval, are all precomputed in __init__.
                engine.destroy()
                _forget_engine(engine)
                self._precompute_engine = None

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            if all(name in dataset.column_names for name in ID_COLUMNS):
                return dataset  # tokenized once, as TRL tokenizes, by the starting process (zero_kit.data.preference)
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)

        def _precompute_ref_logps(self, dataset, name, batch_size):
            """TRL's precomputation (under zero_kit's cache key, `_keyed_by`), timed: whether it ran or read the
            cache beside the prepared pairs is said on the reference's line."""
            where = Path(dataset.cache_files[0]["filename"]).parent if dataset.cache_files else None
            before = set(where.glob("cache-*.arrow")) if where else set()
            start = time.monotonic()
            done = super()._precompute_ref_logps(dataset, name, batch_size)
            new = set(where.glob("cache-*.arrow")) - before if where else set()
            self.zero_kit_precomputed[name] = {"pairs": len(dataset), "seconds": time.monotonic() - start,
                                               "reused": where is not None and not new, "where": where}  # fmt: skip
            return done

        def create_model_card(self, *args, **kwargs):
            """No README.md in --output: zero-kit writes there only its own files (guards.output)."""

        def _send_telemetry(self):
            """zero-kit runs offline: nothing is sent (TRL >= 1.x reports its trainers' use to the Hub)."""

    return counting(PreparedPairsDPOTrainer)


def _forget_engine(engine) -> None:
    """What DeepSpeed's destroy (0.19.8) leaves of an engine on its model, removed so that the training engine
    built later is the only one the model calls:
    - the engine's own forward pre- and post-hook on the root module (`module_forward_pre_hook`, `..._post_hook`);
    - at ZeRO-3, each module's backward functions (`pre_bwd_fn`, `post_bwd_fn`), which the first engine to register
      the module sets and later ones keep (parameter_offload.py: `if "pre_bwd_fn" not in module.__dict__`). Left
      bound to the destroyed engine, every backward fetched and released parameters through its coordinator: the
      training engine's trace held the forward only, so it released every parameter after forward and gathered it
      again in backward (2.7x the all-gathers, a 36% slower step on the embedded model, benchmarks/dpo)."""
    for name in ("module_forward_pre_hook", "module_forward_post_hook"):
        handle = getattr(engine, name, None)
        if handle is not None:
            handle.remove()
            setattr(engine, name, None)
    for module in engine.module.modules():
        module.__dict__.pop("pre_bwd_fn", None)
        module.__dict__.pop("post_bwd_fn", None)


@contextlib.contextmanager
def _keyed_by(key: str):
    """TRL's DPOTrainer.__init__ hashes every weight of the starting model for its precompute cache key
    (`hash_module`: each tensor as fp32 bytes through sha256; 11.8 s for a 1.1B-parameter model on one core of this
    machine, on every rank at every start: about 90 s at 8B), a key zero-kit then replaces (`reference_key`).
    While the trainer is built, the name TRL's module calls returns zero-kit's key instead.
    tests/unit/test_preference.py pins that name against the installed TRL."""
    from trl.trainer import dpo_trainer

    hashing = getattr(dpo_trainer, "hash_module", None)
    if hashing is None:  # a TRL without the precompute cache (zero-kit runs its precompute on TRL >= 1.9 only)
        yield
        return
    dpo_trainer.hash_module = lambda module: key
    try:
        yield
    finally:
        dpo_trainer.hash_module = hashing


def build_reference(opts: TrainOptions, precompute: bool):
    """The reference of full fine-tuning: the starting model again, built as the trained one is (zero_kit.model;
    under ZeRO-3 inside zero.Init, which the run's TrainingArguments registered). None with LoRA (the base model,
    adapter off, is the reference) and when the log-probabilities are precomputed (from the starting model itself,
    before training)."""
    if opts.lora_r is not None or precompute:
        return None
    import torch

    from zero_kit import model as zk_model

    return zk_model.load_model(
        opts.model, dtype=torch.float32, seed=opts.seed, trust_remote_code=opts.trust_remote_code
    )


def dpo_trainer(cls: type, opts: TrainOptions, model, args, tokenizer, data, callbacks: list, *, zero3: bool):
    """The run's DPOTrainer: the model (wrapped by TRL with the adapter under --lora-r), the reference (prepared by
    TRL with DeepSpeed, no optimizer; or, as `args` says, its log-probabilities precomputed) and the prepared
    pairs."""
    from zero_kit.train.lora import lora_config

    trainer = cls(
        model=model,
        ref_model=build_reference(opts, args.precompute_ref_log_probs),
        reference_key=reference_key(opts, args),
        args=args,
        train_dataset=data.dataset,
        eval_dataset=data.eval_dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=lora_config(opts, model.config.model_type) if opts.lora_r is not None else None,
    )
    if opts.lora_r is not None and zero3:  # as zero_kit.train.lora.apply_lora does, for the same reason
        trainer.model.enable_input_require_grads()
    return trainer


def say_reference(trainer, count_held, speak: bool) -> None:
    """One line about the reference model; `count_held(module)` gathers the elements each rank holds (a collective:
    every rank calls this)."""
    if trainer.args.precompute_ref_log_probs:
        if speak:
            say(f"zero-kit train: DPO reference: {precomputed_line(trainer.zero_kit_precomputed)}")
        return
    if trainer.ref_model is None:
        if speak:
            say("zero-kit train: DPO reference: the base model with the LoRA adapter off (no second model)")
        return
    module = getattr(trainer.ref_model, "module", trainer.ref_model)  # TRL's DeepSpeed engine around the model
    held = count_held(module)
    if speak:
        per_rank = ", ".join(f"{n:,}" for n in held["elements_held_per_rank"])
        say(f"zero-kit train: DPO reference: a frozen copy of the starting model, {held['total_parameters']:,} "
            f"parameters, held per rank: [{per_rank}] (DeepSpeed, no optimizer)")  # fmt: skip


def precomputed_line(passes: dict) -> str:
    """What the precomputation did, per dataset (train, eval): computed or read back, where, how long."""
    said = []
    for name, done in passes.items():
        where = done["where"]
        if done["reused"]:
            said.append(f"{name}: log-probabilities of {done['pairs']:,} pairs read from the cache in {where} "
                        f"({done['seconds']:.1f} s)")  # fmt: skip
        else:
            cached = f", cached in {where} for the next run on these pairs and this model" if where else ""
            said.append(f"{name}: log-probabilities of {done['pairs']:,} pairs precomputed in "
                        f"{done['seconds']:.1f} s{cached}")  # fmt: skip
    return "; ".join(said) + "; no reference model in memory while training"

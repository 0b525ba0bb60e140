"""The fine-tuning job: HF Trainer + DeepSpeed ZeRO, full or LoRA, crash-safe checkpoints, resume, export.

One entry for one rank or many: under `deepspeed`, `torchrun` or `accelerate launch` this process is one
rank; started plainly with `--nproc N` it re-launches itself under the `deepspeed` launcher
(zero_kit.train.relaunch). The DeepSpeed config comes from zero_kit.config.builder (or a linted --ds-config).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from zero_kit.dist import barrier, end_process_group, free_port, single_process_env, slurm_to_torch_env, under_launcher
from zero_kit.errors import UserError
from zero_kit.train import checkpoint, preflight, universal
from zero_kit.train.options import EXIT_PREEMPTED, TrainOptions, check_options, default_lr
from zero_kit.train.relaunch import RELAUNCHED, relaunch
from zero_kit.watchdog import HEARTBEAT_DIR, Heartbeat, nccl_watchdog_env

FINAL_DIR = "final"


def run_train(opts: TrainOptions) -> int:
    """Run `zero-kit train`; returns the process exit code (0, or EXIT_PREEMPTED after SIGTERM)."""
    check_options(opts)
    os.environ.update(slurm_to_torch_env(dict(os.environ)))
    if not under_launcher():
        wants_ranks = opts.hostfile or (opts.nproc and opts.nproc > 1)
        if wants_ranks and not os.environ.get(RELAUNCHED):
            return relaunch(opts, opts.nproc)
        os.environ.update(single_process_env(opts.master_port or free_port()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.update({k: v for k, v in nccl_watchdog_env(opts.stall_timeout).items() if k not in os.environ})
    finished = False
    try:
        code = _run_rank(opts)
        finished = True
        return code
    finally:
        end_process_group(finished)


def _run_rank(opts: TrainOptions) -> int:
    import torch

    from zero_kit.train.trainer_config import adopt_file_values, trainer_ds_config

    output = Path(opts.output)
    cuda = torch.cuda.is_available()
    ds_config = trainer_ds_config(opts, torch_adam=not cuda, device="cuda" if cuda else "cpu")
    opts = adopt_file_values(opts, ds_config)
    # TrainingArguments(deepspeed=...) must exist before the model: it registers HfDeepSpeedConfig, so a
    # ZeRO-3 model is built inside deepspeed.zero.Init and no rank ever holds all of it.
    args = _training_arguments(opts, ds_config, output)
    # Output dir, disk space, NVMe path, host RAM: before any work.
    run = {"model": opts.model, "output": output, "lora_r": opts.lora_r, "from_file": opts.ds_config is not None}
    preflight.check_training_run(ds_config, args, **run)
    heartbeat = None
    if opts.stall_timeout > 0:
        heartbeat = Heartbeat(output / HEARTBEAT_DIR, args.process_index, args.world_size, opts.stall_timeout).start()
    try:
        return _train(opts, ds_config, args, output, heartbeat)
    finally:
        if heartbeat is not None:
            heartbeat.stop()


def _train(opts: TrainOptions, ds_config: dict, args, output: Path, heartbeat) -> int:
    # Start-up beats at each milestone: each part (imports and rendezvous, a universal conversion, the model, the
    # data, DeepSpeed's engine and op loads) gets the long-phase allowance, not all of them together.
    starting = (lambda: heartbeat.beat("startup", 0)) if heartbeat is not None else (lambda: None)
    _init_deepspeed_comm(args)
    starting()
    resume_from = _resolve_resume(opts, output, args)
    universal.prepare_resume(resume_from, args)  # written at another world size: convert, load_universal
    starting()
    tokenizer, model, held = _build_model(opts)
    starting()
    dataset, collator, stats = _build_data(opts, tokenizer)
    starting()
    run_info = _run_info(opts, ds_config, args, held, stats)
    if args.process_index == 0:
        output.mkdir(parents=True, exist_ok=True)
        checkpoint.atomic_write_text(output / checkpoint.RUN_INFO, json.dumps(run_info, indent=1) + "\n")
        _print_start(opts, args, held, stats, resume_from, run_info["zero_stage"])
    trainer, preemption = _trainer(opts, args, model, tokenizer, dataset, collator, output, run_info, heartbeat)
    with preflight.disk_errors_as_user_errors(output):  # a disk that fills up mid-run: a message, not a traceback
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if preemption.stopped:
        if args.process_index == 0:
            print(f"zero-kit train: preempted; checkpoint saved, exit {EXIT_PREEMPTED}", file=sys.stderr)
        return EXIT_PREEMPTED
    if opts.export:
        _export_final(output, args)
    return 0


def _training_arguments(opts: TrainOptions, ds_config: dict, output: Path):
    import dataclasses

    import torch
    from transformers import TrainingArguments

    on_gpu = torch.cuda.is_available()
    precision = _precision(opts.precision, on_gpu)
    # transformers 5.23 renamed gradient_checkpointing to activation_checkpointing and warns (FutureWarning)
    # whenever the old keyword is passed, even as False; releases before 5.23 know only the old one.
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return TrainingArguments(
        output_dir=str(output),
        deepspeed=ds_config,
        use_cpu=not on_gpu,
        ddp_backend=None if on_gpu else "gloo",
        ddp_timeout=opts.collective_timeout,
        per_device_train_batch_size=opts.micro_batch,
        gradient_accumulation_steps=opts.grad_accum,
        learning_rate=default_lr(opts),
        lr_scheduler_type=opts.lr_scheduler,
        warmup_steps=opts.warmup_steps,
        weight_decay=opts.weight_decay,
        max_grad_norm=opts.gradient_clipping,
        max_steps=opts.max_steps or -1,
        num_train_epochs=opts.epochs,
        save_strategy="steps" if opts.save_steps else "no",
        save_steps=opts.save_steps or 500,
        save_total_limit=None,  # rotation is ours: only after a newer checkpoint is complete
        logging_steps=opts.log_steps,
        seed=opts.seed,
        data_seed=opts.seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        **{checkpointing: opts.activation_checkpointing},
        include_num_input_tokens_seen="non_padding",
        report_to=[],
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        save_only_model=False,
    )


def _init_deepspeed_comm(args) -> None:
    """zero.Init reads the world size from deepspeed.comm, which the Trainer only sets up later (at
    deepspeed.initialize); without this a ZeRO-3 model would be built for a world of one."""
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if args.use_cpu else "nccl", timeout=_timedelta(args.ddp_timeout))


def _timedelta(seconds: int):
    from datetime import timedelta

    return timedelta(seconds=seconds)


def _precision(choice: str, on_gpu: bool) -> str:
    import torch

    if choice == "auto":
        if not on_gpu:
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if choice in ("bf16", "fp16") and not on_gpu:
        raise UserError(
            f"--precision {choice} needs a GPU; this host has none", "use --precision fp32 (or auto) on CPU"
        )
    return choice


def _resolve_resume(opts: TrainOptions, output: Path, args) -> Path | None:
    """auto: newest complete checkpoint (incomplete leftovers are deleted); never: fresh; else the given path."""

    if opts.resume == "never":
        if args.process_index == 0 and checkpoint.list_checkpoints(output):
            print(f"zero-kit train: --resume never: removing earlier checkpoints in {output}", file=sys.stderr)
            checkpoint.remove_all(output)
        found = None
    elif opts.resume == "auto":
        found = checkpoint.newest_complete(output)
    else:
        found = Path(opts.resume)
        if not checkpoint.is_complete(found):
            raise UserError(
                f"--resume {found}: not a complete zero-kit checkpoint (no {checkpoint.MANIFEST} or files missing)",
                "give a checkpoint-N directory written by zero-kit train, or use --resume auto",
            )
    if opts.resume != "never" and args.process_index == 0:
        checkpoint.remove_incomplete(output)
    barrier()
    return found


def _build_model(opts: TrainOptions):
    """Tokenizer and model (LoRA-wrapped if asked); `held` = parameter elements each rank holds right after
    construction, gathered from all ranks: under ZeRO-3 every entry is about total / world size."""
    import torch

    from zero_kit import model as zk_model

    tokenizer = zk_model.load_tokenizer(opts.model)
    model = zk_model.load_model(opts.model, dtype=torch.float32, seed=opts.seed)
    held = _gather_held_elements(model)
    if opts.activation_checkpointing:
        model.config.use_cache = False
    if opts.lora_r is not None:
        model = _apply_lora(model, opts)
    return tokenizer, model, held


def _gather_held_elements(model) -> dict:
    import torch
    import torch.distributed as dist

    local = sum(p.numel() + (p.ds_tensor.numel() if hasattr(p, "ds_tensor") else 0) for p in model.parameters())
    total = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    per_rank = [local]
    if dist.is_initialized():
        tensor = torch.zeros(dist.get_world_size(), dtype=torch.int64)
        tensor[dist.get_rank()] = local
        dist.all_reduce(tensor)
        per_rank = tensor.tolist()
    return {"total_parameters": total, "elements_held_per_rank": per_rank}


def _apply_lora(model, opts: TrainOptions):
    import warnings

    from peft import LoraConfig, get_peft_model

    targets = [name.strip() for name in opts.lora_targets.split(",") if name.strip()]
    config = LoraConfig(
        r=opts.lora_r,
        lora_alpha=opts.lora_alpha if opts.lora_alpha is not None else 2 * opts.lora_r,
        lora_dropout=opts.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    try:
        with warnings.catch_warnings():
            # peft >= 0.21 reads model.is_gradient_checkpointing, which transformers >= 5.23 deprecates: their
            # warning, not the user's to act on. Only that message is silenced, only around this call.
            warnings.filterwarnings(
                "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            return get_peft_model(model, config)
    except ValueError as err:
        raise UserError(f"--lora-targets {opts.lora_targets}: {err}", "name Linear modules of the model") from err


def _build_data(opts: TrainOptions, tokenizer):
    from zero_kit.data import dataset as zk_data

    rows = zk_data.load_dataset_rows([opts.data] if opts.data else None, opts.format)
    dataset, stats = zk_data.tokenize_dataset(
        rows, tokenizer, opts.format, opts.max_length, skip_bad=opts.skip_bad, pack=opts.pack
    )
    return dataset, zk_data.DataCollator(tokenizer.pad_token_id), stats


def _run_info(opts: TrainOptions, ds_config: dict, args, held: dict, stats) -> dict:
    """What `zero-kit export` needs to rebuild the model, plus what a reader of the run wants to know."""
    stats_dict = {k: v for k, v in vars(stats).items() if isinstance(v, (int, str))}
    return {
        "options": asdict(opts),
        "world_size": args.world_size,
        "zero_stage": ds_config.get("zero_optimization", {}).get("stage", 0),
        "zero3_init": held,
        "data": stats_dict,
    }


def _print_start(opts, args, held, stats, resume_from, stage) -> None:
    per_rank = ", ".join(f"{n:,}" for n in held["elements_held_per_rank"])
    print(
        f"zero-kit train: {args.world_size} rank(s), ZeRO stage {stage}, {'LoRA r=' + str(opts.lora_r) if opts.lora_r else 'full fine-tuning'}; "
        f"model {held['total_parameters']:,} parameters, held per rank after construction: [{per_rank}]",
        flush=True,
    )
    print(f"zero-kit train: {stats.summary()}", flush=True)
    print(f"zero-kit train: {'resuming from ' + str(resume_from) if resume_from else 'starting fresh'}", flush=True)


def _trainer(opts, args, model, tokenizer, dataset, collator, output: Path, run_info: dict, heartbeat):
    from transformers import PrinterCallback, Trainer

    from zero_kit.train.callbacks import (
        CompleteCheckpointCallback,
        HeartbeatCallback,
        PreemptionCallback,
        ProgressCallback,
        SaveAtEndCallback,
        ThroughputCallback,
    )

    throughput = ThroughputCallback(model, seq_len=opts.max_length)
    preemption = PreemptionCallback()
    callbacks = [
        throughput,
        ProgressCallback(output, throughput),
        SaveAtEndCallback(),
        preemption,
        CompleteCheckpointCallback(output, opts.save_total_limit, run_info),
        *([HeartbeatCallback(heartbeat)] if heartbeat is not None else []),  # last: sees this step's save decision
    ]
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # our ProgressCallback prints the same, readably, on rank 0 only
    return trainer, preemption


def _export_final(output: Path, args) -> None:
    # Rank 0 only and no barrier afterwards: a long export must not trip the other ranks' collective timeout.
    if args.process_index == 0:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        from zero_kit.train.export import export_checkpoint

        # Training is over: models the export builds (the LoRA base) must not enter zero.Init, whose
        # collectives would wait for ranks that are not there.
        unset_hf_deepspeed_config()

        ckpt = checkpoint.newest_complete(output)
        if ckpt is None:
            raise UserError(f"no complete checkpoint in {output} to export", "run with --save-steps or check the log")
        result = export_checkpoint(ckpt, output / FINAL_DIR)
        print(f"zero-kit train: exported {ckpt.name} to {result}", flush=True)

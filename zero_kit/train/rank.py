"""One rank of a `zero-kit train` job: it runs the plan it was given (zero_kit.train.plan) and derives none of it
again. A straight line: the rank's environment, its device, TrainingArguments, preflight, the model, the data, the
Trainer, training, and the final export.

A rank of a relaunch gets its plan from the starting process (zero_kit.train.parent) in its environment; a process
that started the job itself (alone, or one rank of an outside launcher) passes its own plan in.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from zero_kit.checkpoints import store, universal
from zero_kit.checkpoints.claim import check_handed
from zero_kit.dist import barrier, end_process_group
from zero_kit.errors import UserError
from zero_kit.lint.installed import ulysses_gradient_scale
from zero_kit.log import VERBOSE_ENV, say, warn
from zero_kit.train import rundata, startup, stopping
from zero_kit.train.guards import fit, oom, preflight
from zero_kit.train.guards.output import FINAL_DIR, mark
from zero_kit.train.lora import apply_lora
from zero_kit.train.options import TrainOptions, default_lr, report_targets, write_effective
from zero_kit.train.plan import PlannerView, RunPlan
from zero_kit.train.preference import arguments_class, method_arguments
from zero_kit.train.resume import JOB_ID_KEY
from zero_kit.watchdog import HEARTBEAT_DIR, Heartbeat


@dataclass(frozen=True)
class Rank:
    """Where this rank runs: the facts of its own process, not of the run."""

    number: int
    """RANK: rank 0 writes the run record and speaks."""
    device: str
    """"cuda:N" (this rank's GPU) or "cpu"."""
    led: bool
    """A starting process (zero_kit.train.parent) launched this rank and says the job's last line itself."""


def run_planned(environ) -> int | None:
    """A rank of a relaunch: run the plan its starting process handed it (None: no plan, this process starts the
    job itself)."""
    plan = RunPlan.from_env(environ)
    if plan is None:
        return None
    return run_rank(plan, rundata.prepare(plan.options, False), startup.StartupClock(), led=True)


def run_rank(plan: RunPlan, prepared: rundata.Prepared, clock: startup.StartupClock, *, led: bool) -> int:
    startup.rank_environment(plan)  # before torch's first import
    finished = False
    try:
        code = _run(plan, prepared, clock, led)
        finished = code != preflight.EXIT_DISK_FULL  # a peer may have left in the save: no last barrier
        return code
    finally:
        end_process_group(finished)


def _run(plan: RunPlan, prepared: rundata.Prepared, clock: startup.StartupClock, led: bool) -> int:
    clock.imports()  # torch, transformers and DeepSpeed: one stage, not spread over the others
    me = this_rank(plan, led)
    if me.number == 0 and plan.claim_token:  # before anything is deleted or written: the claim is still its parent's
        check_handed(plan.output, plan.claim_token)
    if plan.world_size > 1:  # a signal before training: leave at once, see stopping
        stopping.leave_at_once_on_signal(plan.output, me.number == 0 and not me.led)
    # TrainingArguments(deepspeed=...) must exist before the model: it registers HfDeepSpeedConfig, so a
    # ZeRO-3 model is built inside deepspeed.zero.Init and no rank ever holds all of it.
    args = _training_arguments(plan)
    view = plan.planner()
    kept = preflight.run_checkpoints(plan.options, plan.output)  # checkpoints held at once (--save-total-limit)
    preflight.run_preflight(plan.output, view, plan.nvme_dirs, kept)  # output dir, disk space, NVMe path, host RAM
    fit.say(fit.check_gpu_memory(plan, view, me.device))  # this rank's GPU against the plan: before the model
    heartbeat = _start_heartbeat(plan, me)
    try:
        return _train(plan, me, view, args, heartbeat, prepared, clock)
    finally:
        if heartbeat is not None:
            heartbeat.stop()


def this_rank(plan: RunPlan, led: bool) -> Rank:
    """This process's rank and device (zero_kit.dist selects its GPU); a device of another kind than the plan's
    (a hostfile's GPU hosts planned from a login node without one, or the reverse) is refused."""
    from zero_kit.dist import device_and_backend

    device, _ = device_and_backend()
    if (device != "cpu") != plan.on_gpu:
        planned, found = ("GPU", "CPU") if plan.on_gpu else ("CPU", "GPU")
        raise UserError(
            f"this rank runs on a {found} host, but the run was planned for {planned} ranks on the host that "
            "started it",
            "start zero-kit train on a host of the same kind as the ranks' (with the same GPUs, or none)",
        )
    return Rank(number=int(os.environ.get("RANK", "0")), device=device, led=led)


def _start_heartbeat(plan: RunPlan, me: Rank) -> Heartbeat | None:
    if plan.options.stall_timeout <= 0:
        return None
    return Heartbeat(plan.output / HEARTBEAT_DIR, me.number, plan.world_size, plan.options.stall_timeout).start()


def _train(plan: RunPlan, me: Rank, view: PlannerView, args, heartbeat: Heartbeat | None,
           prepared: rundata.Prepared, clock: startup.StartupClock) -> int:  # fmt: skip
    # Start-up beats at each milestone: each part (imports and rendezvous, a universal conversion, the model, the
    # data, DeepSpeed's engine and op loads) gets the long-phase allowance, not all of them together.
    beat = (lambda: heartbeat.beat("startup", 0)) if heartbeat is not None else (lambda: None)
    starting = startup.milestones(clock, beat)  # each also closes a stage of the start-up clock
    init_deepspeed_comm(plan.backend, plan.options.collective_timeout)
    beat()
    resume_from = Path(plan.resume_from) if plan.resume_from else None  # chosen in the plan: nothing deleted yet
    universal.prepare_resume(resume_from, args)  # written at another world size: convert, load_universal
    starting("rendezvous")
    tokenizer, model, held = _build_model(plan.options, zero3=plan.zero_stage == 3)
    starting("model")
    equal = None if plan.on_gpu else plan.options.max_length  # gloo gathers a group's batches only at one size
    data = rundata.load(prepared, tokenizer, plan.options.sp, equal)  # memory-mapped
    starting("data")
    run_info = _record_start(plan, me, held, data, resume_from)
    trainer, preemption, diverged = _trainer(plan, me, args, model, tokenizer, data, run_info, heartbeat, clock)
    _clear_earlier(plan, me)  # the model, the data and the Trainer are built: now earlier work may go
    planned, fix = fit.plan_and_fix(view, plan.options, plan.on_gpu)
    try:
        with oom.out_of_memory_named(planned, fix, lambda: trainer.state.global_step):  # a message, no traceback
            trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        return _finish(plan, me, preemption, diverged.found)
    except Exception as err:  # a disk that filled up, in this rank's write or a peer's that left: one line
        need, _ = preflight.run_checkpoint_bytes(view)
        ended = preflight.disk_full_error(err, plan.output, need, trainer.state.global_step)
        if ended is None:
            raise
        error, plain_to_all = ended
        if me.number == 0 or not plain_to_all:  # rank 0 says it, unless only this rank can know
            warn(f"zero-kit train: error: {error}")
        return error.exit_code


def _finish(plan: RunPlan, me: Rank, preemption, diverged) -> int:
    """After training: the exit code of a stop (`diverged`: guards.diverged's finding; a signal), or the export."""
    if diverged is not None:  # every rank stopped at the same step
        return _end_diverged(plan, me, diverged)
    if preemption.stopped:  # SIGINT or SIGTERM: saved; the starting process, if it launched us, says the last line
        if me.number == 0 and not me.led:
            argv = sys.argv[1:] if plan.world_size == 1 else None  # else: an outside launcher's ranks
            warn(stopping.stop_line(preemption.signum, plan.output, argv))
        return stopping.exit_code(preemption.signum)
    if plan.options.export:
        _export_final(plan, me)
    return 0


def _end_diverged(plan: RunPlan, me: Rank, found) -> int:
    """A diverged run: no final/ unless --export-diverged; rank 0 says the one line (guards.diverged)."""
    from zero_kit.train.guards.diverged import EXIT_DIVERGED, diverged_error

    opts = plan.options
    exported = opts.export_diverged and opts.export
    if exported:
        _export_final(plan, me)
    if me.number == 0:
        if not opts.export_diverged:
            store.remove_incomplete(plan.output)  # a save due at that step was begun (marked), never written
        default = default_lr(replace(opts, lr=None))
        error = diverged_error(found, plan.learning_rate, default, plan.output, given=opts.lr is not None,
                               exported=exported)  # fmt: skip
        warn(f"zero-kit train: error: {error}")
    return EXIT_DIVERGED


def _training_arguments(plan: RunPlan):
    import dataclasses

    from transformers import TrainingArguments

    opts, on_gpu = plan.options, plan.on_gpu
    # transformers 5.23 renamed gradient_checkpointing to activation_checkpointing and warns (FutureWarning)
    # whenever the old keyword is passed, even as False; releases before 5.23 know only the old one.
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return arguments_class(opts)(  # TrainingArguments, or TRL's DPOConfig (zero_kit.train.preference)
        output_dir=str(plan.output),
        deepspeed=plan.ds_config,
        use_cpu=not on_gpu,
        ddp_backend=None if on_gpu else plan.backend,
        ddp_timeout=opts.collective_timeout,
        per_device_train_batch_size=plan.micro_batch,
        gradient_accumulation_steps=plan.grad_accum,
        max_steps=opts.max_steps or -1,
        learning_rate=plan.learning_rate,
        lr_scheduler_type=opts.lr_scheduler,
        warmup_steps=opts.warmup_steps,
        save_strategy="steps" if opts.save_steps else "no",
        weight_decay=opts.weight_decay,
        max_grad_norm=opts.gradient_clipping,
        logging_nan_inf_filter=False,  # a NaN loss must reach the log, where guards.diverged stops the run
        num_train_epochs=opts.epochs,
        save_steps=opts.save_steps or 500,
        save_total_limit=None,  # rotation is ours: only after a newer checkpoint is complete
        logging_steps=opts.log_steps,
        seed=opts.seed,
        data_seed=opts.seed,
        bf16=plan.precision == "bf16",
        fp16=plan.precision == "fp16",
        **{checkpointing: opts.activation_checkpointing},
        **evaluation_arguments(opts, plan.micro_batch),  # evaluation, and the trackers of --report-to
        **method_arguments(opts, bool(plan.dpo_precompute)),  # --method dpo's: beta, loss, max length, reference
        **sequence_parallel_arguments(opts.sp),
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        save_only_model=False,
    )


def sequence_parallel_arguments(sp: int) -> dict:
    """--sp N: Ulysses through the Trainer's own parallelism config (accelerate's ParallelismConfig, DeepSpeed's
    backend): accelerate registers DeepSpeed's UlyssesSPAttentionHF around SDPA, wraps the train dataloader in
    UlyssesSPDataLoaderAdapter (each rank gets 1/N of every sequence of its group), and the Trainer weighs the
    shards' losses by their tokens (deepspeed_sp_compute_loss). Rows may differ in length between batches."""
    if sp <= 1:
        return {}
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True, sp_attn_implementation="sdpa")
    return {"parallelism_config": ParallelismConfig(sp_backend="deepspeed", sp_size=sp, sp_handler=handler)}


def evaluation_arguments(opts: TrainOptions, micro_batch: int) -> dict:
    """The TrainingArguments of evaluation (the Trainer's evaluate(), in which every rank takes part, as ZeRO-3
    needs) and tracking (its report_to integrations: TensorBoard, W&B, MLflow). prediction_loss_only: the eval loop
    keeps no logits (a gather of vocabulary-wide logits from every rank would cost more memory than the model)."""
    targets = [name for name in report_targets(opts.report_to) if name != "none"]
    return {
        "eval_strategy": "steps" if opts.eval_steps else "no",
        "eval_steps": opts.eval_steps,
        "per_device_eval_batch_size": micro_batch,
        "prediction_loss_only": True,
        "label_names": ["labels"],  # a peft-wrapped model hides the labels argument from the Trainer's lookup
        "report_to": targets,
        "run_name": opts.run_name,
    }


def init_deepspeed_comm(backend: str, timeout_s: float) -> None:
    """Bring deepspeed.comm up before the model is built (also for `zero_kit.hf.training_arguments`). zero.Init
    reads the world size from deepspeed.comm, which on CPU nothing else sets up before deepspeed.initialize (the
    Trainer's gloo group is torch's, which DeepSpeed does not see): without this a ZeRO-3 model would be built,
    and its config's batch sizes checked, for a world of one."""
    from zero_kit.launch.ops import init_distributed

    init_distributed(backend, timeout_s)  # op loads guarded (no dead lock waited on); no shared memory left behind


def _clear_earlier(plan: RunPlan, me: Rank) -> None:
    """Rank 0, once the run's inputs have passed and right before training, then a barrier: `--resume never`
    deletes zero-kit's earlier checkpoints, otherwise only zero-kit's leftovers of a save cut short go. Another
    tool's `checkpoint-N` is never touched (zero_kit.checkpoints.store). Says what it deleted."""
    output = plan.output
    if me.number == 0:
        if plan.options.resume == "never":
            done, why = store.remove_all(output), "--resume never: removed earlier checkpoints"
        else:
            done, why = store.remove_incomplete(output), "removed checkpoints a cut-short save left"
        for line in done.lines(why, output):
            warn(f"zero-kit train: {line}")
    barrier()


def _build_model(opts: TrainOptions, zero3: bool = False):
    """Tokenizer and model (LoRA-wrapped if asked); `held` = parameter elements each rank holds right after
    construction, gathered from all ranks: under ZeRO-3 every entry is about total / world size."""
    import torch

    from zero_kit import model as zk_model

    trust = opts.trust_remote_code
    tokenizer = zk_model.load_tokenizer(opts.model, trust_remote_code=trust)
    model = zk_model.load_model(opts.model, dtype=torch.float32, seed=opts.seed, trust_remote_code=trust)
    held = _gather_held_elements(model)
    if opts.activation_checkpointing:
        model.config.use_cache = False
    if opts.lora_r is not None and opts.method != "dpo":  # DPO: TRL wraps it, to switch the adapter off
        model = apply_lora(model, opts, zero3)
    if opts.tiled_compute:
        from zero_kit.train.long_sequences.tiled import tile

        tile(model)
    return tokenizer, model, held


def _gather_held_elements(model) -> dict:
    import torch
    import torch.distributed as dist

    from zero_kit.dist import collective_device

    local = sum(p.numel() + (p.ds_tensor.numel() if hasattr(p, "ds_tensor") else 0) for p in model.parameters())
    total = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    per_rank = [local]
    if dist.is_initialized():
        tensor = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=collective_device())
        tensor[dist.get_rank()] = local
        dist.all_reduce(tensor)
        per_rank = tensor.tolist()
    return {"total_parameters": total, "elements_held_per_rank": per_rank}


def _record_start(plan: RunPlan, me: Rank, held: dict, data: rundata.Data, resume_from: Path | None) -> dict:
    """The run record: rank 0 writes it to OUTPUT and says the start lines; every checkpoint gets a copy."""
    run_info = {**_run_info(plan, held, data.stats), "data_cache": data.cache}
    if me.number == 0:
        plan.output.mkdir(parents=True, exist_ok=True)
        mark(plan.output)  # zero-kit's output from now on (guards.output)
        store.atomic_write_text(plan.output / store.RUN_INFO, json.dumps(run_info, indent=1) + "\n")
        write_effective(plan.options, plan.output)
        _say_start(plan, held, data.stats, resume_from, None if data.eval_dataset is None else len(data.eval_dataset))
    return run_info


def _run_info(plan: RunPlan, held: dict, stats) -> dict:
    """What `zero-kit export` needs to rebuild the model, plus what a reader of the run wants to know."""
    stats_dict = {k: v for k, v in vars(stats).items() if isinstance(v, (int, str))}
    return {
        "options": asdict(plan.options),
        "world_size": plan.world_size,
        "dp_size": plan.dp_size,
        "zero_stage": plan.zero_stage,
        "precision": plan.precision,
        "zero3_init": held,
        "data": stats_dict,
        JOB_ID_KEY: os.environ.get("SLURM_JOB_ID"),  # a requeued job resumes only its own checkpoints
    }


def _say_start(plan: RunPlan, held: dict, stats, resume_from: Path | None, eval_size: int | None) -> None:
    per_rank = ", ".join(f"{n:,}" for n in held["elements_held_per_rank"])
    tuning = f"LoRA r={plan.options.lora_r}" if plan.options.lora_r else "full fine-tuning"
    ranks = f"{plan.world_size} rank(s)"
    if plan.options.sp > 1:
        ranks += f" in {plan.dp_size} sequence-parallel group(s) of {plan.options.sp}"
    say(
        f"zero-kit train: {ranks}, ZeRO stage {plan.zero_stage}, {tuning}; "
        f"model {held['total_parameters']:,} parameters, held per rank after construction: [{per_rank}]"
    )
    say(f"zero-kit train: {stats.summary()}")
    if eval_size is not None:
        say(f"zero-kit train: evaluation on {eval_size} {'pairs' if plan.options.method == 'dpo' else 'sequences'}")
    say(f"zero-kit train: {'resuming from ' + str(resume_from) if resume_from else 'starting fresh'}")


def _trainer(plan: RunPlan, me: Rank, args, model, tokenizer, data: rundata.Data, run_info: dict,
             heartbeat: Heartbeat | None, clock: startup.StartupClock):  # fmt: skip
    """The HF Trainer with our callbacks, the preemption callback (`stopped`: the run ended on SIGTERM) and the
    divergence callback (`found`: the run stopped on a NaN or infinite loss or gradient norm)."""
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    if os.environ.get(VERBOSE_ENV) != "1":  # third-party bars on every rank's terminal: zero-kit's lines say enough
        import datasets

        hf_logging.disable_progress_bar()  # a bar per checkpoint's shard writing
        datasets.disable_progress_bars()  # and with TQDM_DISABLE, TRL's over a DPO reference's precompute and caching
        os.environ.setdefault("TQDM_DISABLE", "1")

    from zero_kit.train.callbacks import (
        CompleteCheckpointCallback,
        EvalScheduleCallback,
        HeartbeatCallback,
        PerplexityCallback,
        PreemptionCallback,
        ProgressCallback,
        ResumedScheduleCallback,
        SaveAtEndCallback,
        StartupCallback,
        ThroughputCallback,
        TokenCount,
        before_trackers,
        counting_trainer,
    )
    from zero_kit.train.guards.diverged import DivergenceCallback

    throughput = ThroughputCallback(model, seq_len=plan.options.max_length, precision=plan.precision)
    tokens = TokenCount(tokenizer.pad_token_id)  # summed over the ranks in the preemption check's all-reduce
    preemption = PreemptionCallback(me.number, alone=plan.world_size == 1, tokens=tokens)
    opts, perplexity = plan.options, PerplexityCallback()
    diverged = DivergenceCallback(loss_scaled=plan.precision == "fp16", keep=opts.export_diverged)
    callbacks = [
        throughput,
        perplexity,
        tokens,
        ProgressCallback(plan.output, throughput),
        diverged,  # after the step's line is said; before the save it may call off
        SaveAtEndCallback(),
        ResumedScheduleCallback(),
        StartupCallback(clock, plan.output, me.number == 0),
        preemption,
        *([EvalScheduleCallback(opts.keep_best)] if data.eval_dataset is not None else []),  # sees the save decision
        CompleteCheckpointCallback(plan.output, opts.save_total_limit, run_info, keep_best=opts.keep_best),
        *([HeartbeatCallback(heartbeat)] if heartbeat is not None else []),  # last: sees this step's save decision
    ]
    scale = ulysses_gradient_scale(plan.zero_stage, opts.sp)  # DeepSpeed's ZeRO-0/1/2 under --sp
    counting = partial(counting_trainer, tokens, grad_scale=scale)
    trainer = _build_trainer(plan, me, counting, model, args, tokenizer, data, callbacks)
    trainer.remove_callback(PrinterCallback)  # our ProgressCallback says the same, readably, on rank 0 only
    before_trackers(trainer, throughput, perplexity)  # the trackers get tokens/s, MFU and perplexity too
    return trainer, preemption, diverged


def _build_trainer(plan: RunPlan, me: Rank, counting, model, args, tokenizer, data: rundata.Data, callbacks: list):
    """The HF Trainer (counting the tokens it trains: callbacks.counting_trainer), or for --method dpo TRL's
    DPOTrainer with its reference model (zero_kit.train.preference)."""
    if plan.options.method == "dpo":
        from zero_kit.train import preference

        trainer = preference.dpo_trainer(preference.trainer_class(counting), plan.options, model, args, tokenizer,
                                         data, callbacks, zero3=plan.zero_stage == 3)  # fmt: skip
        preference.say_reference(trainer, _gather_held_elements, me.number == 0)
        return trainer
    return counting()(
        model=model,
        args=args,
        train_dataset=data.dataset,
        eval_dataset=data.eval_dataset,
        data_collator=data.collator,
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def _export_final(plan: RunPlan, me: Rank) -> None:
    # Rank 0 only and no barrier afterwards: a long export must not trip the other ranks' collective timeout.
    if me.number == 0:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        from zero_kit.export import export_checkpoint

        # Training is over: models the export builds (the LoRA base) must not enter zero.Init, whose
        # collectives would wait for ranks that are not there.
        unset_hf_deepspeed_config()

        output = plan.output
        best = store.best_complete(output) if plan.options.keep_best else None
        ckpt = best or store.newest_complete(output)
        if ckpt is None:
            raise UserError(f"no complete checkpoint in {output} to export", "run with --save-steps or check the log")
        result = export_checkpoint(
            ckpt,
            output / FINAL_DIR,
            force=plan.options.overwrite_output,
            trust_remote_code=plan.options.trust_remote_code,
        )  # final/ is an earlier export's, or new: a user's files there were refused before launch (guards.output)
        say(f"zero-kit train: exported {ckpt.name} to {result}")

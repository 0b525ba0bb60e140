"""The fine-tuning job: HF Trainer + DeepSpeed ZeRO, full or LoRA, crash-safe checkpoints, resume, export.

One entry for one rank or many: under `deepspeed`, `torchrun` or `accelerate launch` this process is one
rank; started plainly with `--nproc N` it re-launches itself under the `deepspeed` launcher
(zero_kit.train.relaunch). Each rank resolves its run once (zero_kit.train.run: device, precision, sizes, the
DeepSpeed dict, the planner's view), then walks a straight line: arguments, preflight, model, data, Trainer.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

from zero_kit.dist import barrier, end_process_group, slurm_to_torch_env, under_launcher
from zero_kit.errors import UserError
from zero_kit.model import check_trusted, resolve_model
from zero_kit.train import checkpoint, fit, oom, preflight, resume, rundata, runfile, startup, stopping, universal
from zero_kit.train.claim import CLAIM_ENV, hold_claim
from zero_kit.train.evaluation import trainer_arguments
from zero_kit.train.inputs import check_inputs
from zero_kit.train.lora import apply_lora
from zero_kit.train.options import TrainOptions, check_options
from zero_kit.train.relaunch import RELAUNCHED, relaunch
from zero_kit.train.resumed import announce_changes
from zero_kit.train.run import ResolvedRun, resolve_run
from zero_kit.watchdog import HEARTBEAT_DIR, Heartbeat

FINAL_DIR = "final"


def run_train(opts: TrainOptions) -> int:
    """Run `zero-kit train`; returns the process exit code (0; after SIGINT or SIGTERM see train.stopping)."""
    check_options(opts)
    # data, model, output, hostfile: before the relaunch, a process group, an op build, any deletion or heavy import
    check_inputs(opts)
    # one job per output, taken before anything there is read to resume, deleted or written (zero_kit.train.claim)
    held = hold_claim(Path(opts.output), {**os.environ, **slurm_to_torch_env(dict(os.environ))})
    if held.holder is not None:  # handed to the ranks of a relaunch: rank 0 checks it is still this run's
        os.environ[CLAIM_ENV] = held.holder.token
    try:
        return _run_claimed(opts)
    finally:
        held.release()
        if held.holder is not None:
            os.environ.pop(CLAIM_ENV, None)


def _run_claimed(opts: TrainOptions) -> int:
    # a Hub id -> its snapshot directory in the Hugging Face cache (downloaded now, once, if the user allows the
    # network): after every cheap check; the ranks and the run record get the directory
    opts = replace(opts, model=resolve_model(opts.model))
    check_trusted(opts.model, opts.trust_remote_code)  # before a launcher starts ranks that would each refuse it
    os.environ.update(slurm_to_torch_env(dict(os.environ)))
    speak = os.environ.get("RANK", "0") == "0" and not os.environ.get(RELAUNCHED)
    opts = resume.continue_requeued_job(opts, dict(os.environ), speak)  # Slurm requeued the job: never start over
    target = None
    if not os.environ.get(RELAUNCHED):  # once per command, before any rank starts: the ranks of a relaunch skip it
        target = resume.check_before_start(opts, dict(os.environ))
        if target is not None and os.environ.get("RANK", "0") == "0":
            _warn_if_foreign(target)  # its pickles are loaded with weights_only=False by DeepSpeed and the Trainer
    clock = startup.StartupClock()  # time to first step, by stage; a relaunch's ranks go on from its marks
    # tokenized once, before any launcher, process group or op build: a relaunch's ranks find it ready
    prepared = rundata.prepare(opts, speak)
    clock.mark("prepare")
    # the run against this host's RAM, before a launch or weights: after the data, whose errors are found in a
    # fraction of a second (the plan needs the tokenizer's vocabulary, 2-3 s of imports), and whose preparation
    # is cached for the next run if this one is refused
    memory_note = fit.before_launch(opts, dict(os.environ), speak) if not os.environ.get(RELAUNCHED) else None
    if speak and target is not None:  # flags that differ from the resumed run's: said once, then applied
        announce_changes(opts, target, str(prepared.train.path))
    if _wants_relaunch(opts):
        os.environ.update(clock.for_ranks())
        return relaunch(opts, opts.nproc, memory_note=memory_note)
    startup.rank_environment(opts)  # before torch's first import
    finished = False
    try:
        code = _run_rank(opts, prepared, clock)
        finished = True
        return code
    finally:
        end_process_group(finished)


def _wants_relaunch(opts: TrainOptions) -> bool:
    """Started plainly with several ranks asked for: re-launch under the `deepspeed` launcher (once)."""
    wants_ranks = opts.hostfile or (opts.nproc and opts.nproc > 1)
    return not under_launcher() and bool(wants_ranks) and not os.environ.get(RELAUNCHED)


def _run_rank(opts: TrainOptions, prepared: rundata.Prepared, clock: startup.StartupClock) -> int:
    clock.imports()  # torch, transformers and DeepSpeed: one stage, not spread over the others
    run = resolve_run(opts)  # every decision, before any I/O
    if run.machine.world_size > 1:  # a signal before training: leave at once, see stopping
        stopping.leave_at_once_on_signal(run.output, run.machine.rank == 0 and not os.environ.get(RELAUNCHED))
    # TrainingArguments(deepspeed=...) must exist before the model: it registers HfDeepSpeedConfig, so a
    # ZeRO-3 model is built inside deepspeed.zero.Init and no rank ever holds all of it.
    args = _training_arguments(run)
    preflight.check_run(run)  # output dir, disk space, NVMe path, host RAM: before any work
    fit.say(fit.check_gpu_memory(run))  # this rank's GPU against the plan: before the model is built
    heartbeat = _start_heartbeat(run)
    try:
        return _train(run, args, heartbeat, prepared, clock)
    finally:
        if heartbeat is not None:
            heartbeat.stop()


def _start_heartbeat(run: ResolvedRun) -> Heartbeat | None:
    if run.options.stall_timeout <= 0:
        return None
    machine = run.machine
    return Heartbeat(run.output / HEARTBEAT_DIR, machine.rank, machine.world_size, run.options.stall_timeout).start()


def _train(run: ResolvedRun, args, heartbeat: Heartbeat | None, prepared: rundata.Prepared,
           clock: startup.StartupClock) -> int:  # fmt: skip
    # Start-up beats at each milestone: each part (imports and rendezvous, a universal conversion, the model, the
    # data, DeepSpeed's engine and op loads) gets the long-phase allowance, not all of them together.
    beat = (lambda: heartbeat.beat("startup", 0)) if heartbeat is not None else (lambda: None)
    starting = startup.milestones(clock, beat)  # each also closes a stage of the start-up clock
    init_deepspeed_comm(run.machine.backend, run.options.collective_timeout)
    beat()
    resume_from = resume.resume_target(run.options)  # chosen only: nothing is deleted before the inputs passed
    universal.prepare_resume(resume_from, args)  # written at another world size: convert, load_universal
    starting("rendezvous")
    tokenizer, model, held = _build_model(run.options, zero3=run.zero_stage == 3)
    starting("model")
    data = rundata.load(prepared, tokenizer)  # memory-mapped
    starting("data")
    run_info = _record_start(run, held, data, resume_from)
    trainer, preemption = _trainer(run, args, model, tokenizer, data, run_info, heartbeat, clock)
    _clear_earlier(run)  # the model, the data and the Trainer are built: now earlier work may go
    planned, fix = fit.plan_and_fix(run.planner, run.options, run.machine.on_gpu)
    # a disk that fills up mid-run, an out-of-memory: a message each, no traceback
    with (
        preflight.disk_errors_as_user_errors(run.output),
        oom.out_of_memory_named(planned, fix, lambda: trainer.state.global_step),
    ):
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if preemption.stopped:  # SIGINT or SIGTERM: saved; the relaunching parent, if any, prints the last line
        if run.machine.rank == 0 and not os.environ.get(RELAUNCHED):
            argv = sys.argv[1:] if run.machine.world_size == 1 else None  # else: an outside launcher's ranks
            print(stopping.stop_line(preemption.signum, run.output, argv), file=sys.stderr, flush=True)
        return stopping.exit_code(preemption.signum)
    if run.options.export:
        _export_final(run)
    return 0


def _training_arguments(run: ResolvedRun):
    import dataclasses

    from transformers import TrainingArguments

    opts, on_gpu = run.options, run.machine.on_gpu
    # transformers 5.23 renamed gradient_checkpointing to activation_checkpointing and warns (FutureWarning)
    # whenever the old keyword is passed, even as False; releases before 5.23 know only the old one.
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return TrainingArguments(
        output_dir=str(run.output),
        deepspeed=run.ds_config,
        use_cpu=not on_gpu,
        ddp_backend=None if on_gpu else run.machine.backend,
        ddp_timeout=opts.collective_timeout,
        per_device_train_batch_size=run.micro_batch,
        gradient_accumulation_steps=run.grad_accum,
        max_steps=opts.max_steps or -1,
        learning_rate=run.learning_rate,
        lr_scheduler_type=opts.lr_scheduler,
        warmup_steps=opts.warmup_steps,
        save_strategy="steps" if opts.save_steps else "no",
        weight_decay=opts.weight_decay,
        max_grad_norm=opts.gradient_clipping,
        num_train_epochs=opts.epochs,
        save_steps=opts.save_steps or 500,
        save_total_limit=None,  # rotation is ours: only after a newer checkpoint is complete
        logging_steps=opts.log_steps,
        seed=opts.seed,
        data_seed=opts.seed,
        bf16=run.precision == "bf16",
        fp16=run.precision == "fp16",
        **{checkpointing: opts.activation_checkpointing},
        **trainer_arguments(opts, run.micro_batch),  # evaluation, and the trackers of --report-to
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        save_only_model=False,
    )


def init_deepspeed_comm(backend: str, timeout_s: float) -> None:
    """Bring deepspeed.comm up before the model is built (also for `zero_kit.hf.training_arguments`). zero.Init
    reads the world size from deepspeed.comm, which on CPU nothing else sets up before deepspeed.initialize (the
    Trainer's gloo group is torch's, which DeepSpeed does not see): without this a ZeRO-3 model would be built,
    and its config's batch sizes checked, for a world of one."""
    from zero_kit.launch.ops import init_distributed

    init_distributed(backend, timeout_s)  # op loads guarded (no dead lock waited on); no shared memory left behind


def _clear_earlier(run: ResolvedRun) -> None:
    """Rank 0, once the run's inputs have passed and right before training, then a barrier: `--resume never`
    deletes zero-kit's earlier checkpoints, otherwise only zero-kit's leftovers of a save cut short go. Another
    tool's `checkpoint-N` is never touched (zero_kit.train.checkpoint). Says what it deleted."""
    output = run.output
    if run.machine.rank == 0:
        if run.options.resume == "never":
            removed, why = checkpoint.remove_all(output), "--resume never: removed earlier checkpoints"
        else:
            removed, why = checkpoint.remove_incomplete(output), "removed checkpoints a cut-short save left"
        if removed:
            names = ", ".join(path.name for path in removed)
            print(f"zero-kit train: {why} {names} from {output}", file=sys.stderr, flush=True)
    barrier()


def _warn_if_foreign(checkpoint_dir: Path) -> None:
    from zero_kit.model import foreign_warning

    warning = foreign_warning(checkpoint_dir, "--resume")
    if warning:
        print(f"zero-kit train: {warning}", file=sys.stderr, flush=True)


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
    if opts.lora_r is not None:
        model = apply_lora(model, opts, zero3)
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


def _record_start(run: ResolvedRun, held: dict, data: rundata.Data, resume_from: Path | None) -> dict:
    """The run record: rank 0 writes it to OUTPUT and prints the start lines; every checkpoint gets a copy."""
    run_info = {**_run_info(run, held, data.stats), "data_cache": data.cache}
    if run.machine.rank == 0:
        run.output.mkdir(parents=True, exist_ok=True)
        checkpoint.atomic_write_text(run.output / checkpoint.RUN_INFO, json.dumps(run_info, indent=1) + "\n")
        runfile.write_effective(run.options, run.output)
        _print_start(run, held, data.stats, resume_from, None if data.eval_dataset is None else len(data.eval_dataset))
    return run_info


def _run_info(run: ResolvedRun, held: dict, stats) -> dict:
    """What `zero-kit export` needs to rebuild the model, plus what a reader of the run wants to know."""
    stats_dict = {k: v for k, v in vars(stats).items() if isinstance(v, (int, str))}
    return {
        "options": asdict(run.options),
        "world_size": run.machine.world_size,
        "zero_stage": run.zero_stage,
        "precision": run.precision,
        "zero3_init": held,
        "data": stats_dict,
        resume.JOB_ID_KEY: os.environ.get("SLURM_JOB_ID"),  # a requeued job resumes only its own checkpoints
    }


def _print_start(run: ResolvedRun, held: dict, stats, resume_from: Path | None, eval_size: int | None) -> None:
    per_rank = ", ".join(f"{n:,}" for n in held["elements_held_per_rank"])
    tuning = f"LoRA r={run.options.lora_r}" if run.options.lora_r else "full fine-tuning"
    print(
        f"zero-kit train: {run.machine.world_size} rank(s), ZeRO stage {run.zero_stage}, {tuning}; "
        f"model {held['total_parameters']:,} parameters, held per rank after construction: [{per_rank}]",
        flush=True,
    )
    print(f"zero-kit train: {stats.summary()}", flush=True)
    if eval_size is not None:
        print(f"zero-kit train: evaluation on {eval_size} sequences", flush=True)
    print(f"zero-kit train: {'resuming from ' + str(resume_from) if resume_from else 'starting fresh'}", flush=True)


def _trainer(run: ResolvedRun, args, model, tokenizer, data: rundata.Data, run_info: dict,
             heartbeat: Heartbeat | None, clock: startup.StartupClock):  # fmt: skip
    """The HF Trainer with our callbacks, and the preemption callback (`stopped`: the run ended on SIGTERM)."""
    from transformers import PrinterCallback

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
        before_trackers,
    )
    from zero_kit.train.tokens import TokenCount, counting_trainer

    throughput = ThroughputCallback(model, seq_len=run.options.max_length, precision=run.precision)
    tokens = TokenCount(tokenizer.pad_token_id)  # summed over the ranks in the preemption check's all-reduce
    preemption = PreemptionCallback(run.machine.rank, alone=run.machine.world_size == 1, tokens=tokens)
    opts, perplexity = run.options, PerplexityCallback()
    callbacks = [
        throughput,
        perplexity,
        tokens,
        ProgressCallback(run.output, throughput),
        SaveAtEndCallback(),
        ResumedScheduleCallback(),
        StartupCallback(clock, run.output, run.machine.rank == 0),
        preemption,
        *([EvalScheduleCallback(opts.keep_best)] if data.eval_dataset is not None else []),  # sees the save decision
        CompleteCheckpointCallback(run.output, opts.save_total_limit, run_info, keep_best=opts.keep_best),
        *([HeartbeatCallback(heartbeat)] if heartbeat is not None else []),  # last: sees this step's save decision
    ]
    trainer = counting_trainer(tokens)(
        model=model,
        args=args,
        train_dataset=data.dataset,
        eval_dataset=data.eval_dataset,
        data_collator=data.collator,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # our ProgressCallback prints the same, readably, on rank 0 only
    before_trackers(trainer, throughput, perplexity)  # the trackers get tokens/s, MFU and perplexity too
    return trainer, preemption


def _export_final(run: ResolvedRun) -> None:
    # Rank 0 only and no barrier afterwards: a long export must not trip the other ranks' collective timeout.
    if run.machine.rank == 0:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        from zero_kit.train.export import export_checkpoint

        # Training is over: models the export builds (the LoRA base) must not enter zero.Init, whose
        # collectives would wait for ranks that are not there.
        unset_hf_deepspeed_config()

        output = run.output
        best = checkpoint.best_complete(output) if run.options.keep_best else None
        ckpt = best or checkpoint.newest_complete(output)
        if ckpt is None:
            raise UserError(f"no complete checkpoint in {output} to export", "run with --save-steps or check the log")
        result = export_checkpoint(
            ckpt, output / FINAL_DIR, force=True, trust_remote_code=run.options.trust_remote_code
        )  # final/ is zero-kit's, in --output
        print(f"zero-kit train: exported {ckpt.name} to {result}", flush=True)

"""Python API for people with their own Hugging Face `Trainer` script: ZeRO-0..3 on CPU and GPU alike.

    args = training_arguments("out", stage=3, per_device_train_batch_size=4)  # first: before the model
    model = AutoModelForCausalLM.from_pretrained("my-llama")  # ZeRO-3: built inside zero.Init, sharded
    Trainer(model=model, args=args, train_dataset=data, callbacks=[ThroughputCallback(model)]).train()
    finish()  # every rank, last: leaves without the interpreter teardown that can abort a CPU rank

Why the arguments come first: TrainingArguments(deepspeed=...) registers transformers' HfDeepSpeedConfig (a
module-level weak reference to an object the arguments hold), and from_pretrained builds a ZeRO-3 model inside
deepspeed.zero.Init only while it is alive; zero.Init then reads the world size from deepspeed.comm, which
`training_arguments` brings up (on CPU nothing else does before deepspeed.initialize). The guide, with the launch
commands: docs/own_script.md.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from zero_kit.dist import (
    end_process_group,
    exit_rank,
    free_port,
    single_process_env,
    slurm_to_torch_env,
    under_launcher,
)
from zero_kit.errors import UserError, raise_all
from zero_kit.log import library_notices_to_log
from zero_kit.train.callbacks import ThroughputCallback
from zero_kit.train.options import TrainOptions, check_options
from zero_kit.train.plan import trainer_ds_config

# A script that imports zero_kit.hf trains on libraries that warn about each other's deprecated calls (torch's
# collectives under DeepSpeed: thousands of lines in an accelerate loop). Those go to OUTPUT/zero_kit.log once
# training_arguments names the output (held until then); a warning that points at the script itself still shows.
library_notices_to_log()

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


def deepspeed_config(**options: Any) -> dict:
    """The DeepSpeed dict for `TrainingArguments(deepspeed=...)`, from the same options as `zero-kit train`
    (e.g. `stage=3, offload_optimizer="cpu"`, or `ds_config="my.json"` to lint and load a file): the same step
    `zero_kit.train.plan.plan_run` makes the run's dict with. It does not depend on the machine that calls it
    (a script may write the config on a login node for GPU nodes); your TrainingArguments decide the rest. On the
    machine that trains, `training_arguments` does that part too."""
    from zero_kit.launch.ops import skip_shm_op

    opts = TrainOptions(**options)
    check_options(opts)
    skip_shm_op()  # the script trains with DeepSpeed in this process: no shm op built, nothing left in /dev/shm
    return trainer_ds_config(opts)


def training_arguments(
    output_dir: str,
    *,
    stage: int | None = None,
    offload_optimizer: str = "none",
    offload_param: str = "none",
    nvme_path: str | None = None,
    ds_config: str | None = None,
    precision: str = "auto",
    sp: int = 1,
    **training_kwargs: Any,
):
    """Ready `TrainingArguments` for ZeRO on the machine this rank runs on; call it before building the model and
    keep the returned object (it holds what makes from_pretrained build a ZeRO-3 model sharded).

    The ZeRO options are `zero-kit train`'s (`stage`, `offload_optimizer`, `offload_param`, `nvme_path`, or
    `ds_config=` a JSON file, linted); every other keyword goes to `TrainingArguments` as it is. Decided here:
    `deepspeed` (the dict, with torch's AdamW on CPU as `zero-kit train` uses), `use_cpu` and the gloo backend on a
    host without CUDA, bf16/fp16 from `precision` ("auto": bf16 on a GPU that supports it, fp16 on other GPUs,
    fp32 on CPU; `bf16=True` or `fp16=True` count as that choice). Then deepspeed.comm is brought up with the
    Trainer's timeout (`ddp_timeout`), so zero.Init sees the real world size. Started without a launcher it is a
    world of one; under srun, SLURM's variables are translated. Raises UserError for inputs no run can use, every
    one named at once.

    `sp=N` (> 1): Ulysses sequence parallelism as `zero-kit train --sp N` runs it (the Trainer's own
    `parallelism_config`); the ranks must be a multiple of N. Your collator must then give every batch
    `position_ids` and a length divisible by N, and on CPU ranks one length for all batches (gloo gathers a group's
    batches at one size): `zero_kit.data.dataset.DataCollator.for_sp(pad_id, N, length=max_length)` does both."""
    from transformers import TrainingArguments

    from zero_kit.launch.ops import use_extensions_dir
    from zero_kit.train.rank import init_deepspeed_comm, sequence_parallel_arguments

    choice = _precision_choice(precision, training_kwargs)
    zero = {"offload_optimizer": offload_optimizer, "offload_param": offload_param, "nvme_path": nvme_path}
    opts = TrainOptions(stage=stage, ds_config=ds_config, sp=sp, **zero)
    check_options(opts)
    raise_all(_input_problems(precision, training_kwargs), "in training_arguments()")
    machine = _machine()  # under srun, SLURM's variables translated; without a launcher, a world of one
    _check_sp(sp)
    raise_all(_machine_problems(training_kwargs, machine.on_gpu), "in training_arguments()")
    device = "cuda" if machine.on_gpu else "cpu"
    config = trainer_ds_config(opts, torch_adam=not machine.on_gpu, device=device)
    chosen = _resolve_precision(choice, config, ds_config, machine)
    library_notices_to_log(output_dir)
    use_extensions_dir()  # DeepSpeed's op builds (Adam) in this environment's own directory
    kwargs = {k: v for k, v in training_kwargs.items() if k not in ("bf16", "fp16", "use_cpu", "ddp_backend")}
    args = TrainingArguments(
        output_dir,
        deepspeed=config,
        use_cpu=not machine.on_gpu,
        ddp_backend=training_kwargs.get("ddp_backend") if machine.on_gpu else machine.backend,
        bf16=chosen == "bf16",
        fp16=chosen == "fp16",
        **sequence_parallel_arguments(sp),
        **kwargs,
    )
    init_deepspeed_comm(machine.backend, args.ddp_timeout)
    return args


def finish(code: int = 0) -> NoReturn:
    """End this rank after its last save, as `zero-kit train` ends its ranks: meet the other ranks, end the process
    group, run the script's atexit handlers (loggers, trackers), flush, and leave with os._exit(code).

    Leaving through interpreter teardown instead can abort a CPU rank after a finished run ("terminate called without
    an active exception", the launcher's exit 250 or -6): gloo's threads hold work that references Python, freed
    while the interpreter is torn down. `destroy_process_group()` makes that rarer, not impossible (this project's CI
    saw the README's Trainer script abort so after it); os._exit runs no teardown. Call it on every rank, as the
    script's last line (docs/own_script.md)."""
    import atexit

    end_process_group(finished=True)
    atexit._run_exitfuncs()  # what a normal exit would run; os._exit skips them
    exit_rank(code)


def _check_sp(sp: int) -> None:
    """sp= against the launcher's world (before a rendezvous) and the installed libraries."""
    from zero_kit.train.plan import dp_size_of

    dp_size_of(int(os.environ.get("WORLD_SIZE", "1")), sp)
    if sp > 1:
        from zero_kit.train.long_sequences import check_sp_support

        check_sp_support("sp=")


def _precision_choice(precision: str, training_kwargs: dict[str, Any]) -> str:
    """`precision`, or the one of bf16=True / fp16=True the script passed (conflicts: see _input_problems)."""
    flagged = [name for name in ("bf16", "fp16") if training_kwargs.get(name)]
    return flagged[0] if precision == "auto" and len(flagged) == 1 else precision


def _input_problems(precision: str, training_kwargs: dict[str, Any]) -> list[UserError]:
    """What no machine could run: checked before anything is set up."""
    from accelerate.utils import parse_flag_from_env

    problems = []
    if precision not in PRECISIONS:
        problems.append(UserError(f"precision={precision!r} is not one of {PRECISIONS}", 'pass precision="auto"'))
    flagged = [name for name in ("bf16", "fp16") if training_kwargs.get(name)]
    if len(flagged) == 2 or (flagged and precision not in ("auto", flagged[0])):
        given = ", ".join(f"{name}=True" for name in flagged)
        problems.append(UserError(f"{given} and precision={precision!r} disagree", "pass precision= alone"))
    if "deepspeed" in training_kwargs:
        problems.append(
            UserError(
                "deepspeed= is what training_arguments() writes",
                "pass the ZeRO options (stage=3, offload_optimizer=...) or ds_config=PATH instead",
            )
        )
    if parse_flag_from_env("ACCELERATE_USE_CPU"):  # what accelerate's AcceleratorState reads
        problems.append(
            UserError(
                f"ACCELERATE_USE_CPU={os.environ['ACCELERATE_USE_CPU']} in the environment makes accelerate run "
                "without DeepSpeed (the Trainer would train plain data parallel, silently)",
                "unset ACCELERATE_USE_CPU: training_arguments() sets use_cpu=True itself on a host without CUDA",
            )
        )
    return problems


def _machine():
    """This rank's device kind (zero_kit.dist selects its GPU), after giving a process started without a launcher
    a world of one, and one started by srun the torch.distributed variables."""
    from zero_kit.dist import device_and_backend
    from zero_kit.train.plan import Host

    os.environ.update(slurm_to_torch_env(dict(os.environ)))
    if not under_launcher():
        os.environ.update(single_process_env(free_port()))
    device, _ = device_and_backend()
    return Host.of_device(device)


def _machine_problems(training_kwargs: dict[str, Any], on_gpu: bool) -> list[UserError]:
    """use_cpu / ddp_backend given with another value than this machine needs."""
    decided = {"use_cpu": not on_gpu, **({} if on_gpu else {"ddp_backend": "gloo"})}
    where = "a GPU rank" if on_gpu else "a host without CUDA (DeepSpeed trains on CPU with gloo)"
    return [
        UserError(f"{key}={training_kwargs[key]!r} does not fit {where}: it needs {key}={value!r}", f"drop {key}=")
        for key, value in decided.items()
        if key in training_kwargs and training_kwargs[key] != value
    ]


def _resolve_precision(choice: str, config: dict, ds_config: str | None, machine) -> str:
    """The run's precision, as `zero-kit train` picks it (a ds_config file's enabled bf16/fp16 decides "auto")."""
    from zero_kit.train.plan import file_values, resolve_precision

    from_file = file_values(config).get("precision") if ds_config and choice == "auto" else None
    return resolve_precision(from_file or choice, machine, from_file_path=ds_config if from_file else None)


__all__ = ["ThroughputCallback", "deepspeed_config", "finish", "training_arguments"]

"""`zero-kit train`: fine-tune a LLaMA-style model with the HF Trainer and DeepSpeed ZeRO (full or LoRA).

    zero-kit train --nproc 2 --stage 3 --max-steps 30                 # embedded tiny model, bundled data
    deepspeed --num_gpus 8 -m zero_kit.cli train --model DIR --data train.jsonl --stage 3
    torchrun --nproc_per_node 8 -m zero_kit.cli train --model DIR --stage 2 --lora-r 16
    zero-kit train --config run.yaml --max-steps 10                     # a run file; flags win over it

Exit codes: 0 done; 2 bad input; 65 the loss or gradient norm went NaN/inf (lower --lr); 74 the disk filled up at
a save; 75 stopped by SIGTERM after saving a complete checkpoint (relaunch with --resume auto); 76 the stall
watchdog ended it; 130 Ctrl-C (saved); anything else: a rank failed (the job resumes from the newest complete
checkpoint).
"""

from __future__ import annotations

import argparse
import os

from zero_kit.options import add_dataclass_arguments, dataclass_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from zero_kit.train.options import TrainOptions

    parser.add_argument("--config", default=None, metavar="RUN_YAML",
                        help="A run file (YAML) whose keys are this command's flags without the leading -- (max_steps: "
                             "30, stage: 3, ...); flags given on the command line win. Every run writes its effective "
                             "options to OUTPUT/zero_kit_run.yaml, which --config reads back.")  # fmt: skip
    add_dataclass_arguments(parser, TrainOptions)
    # The deepspeed launcher appends --local_rank=N to every rank's argv; the rank comes from the environment.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from zero_kit.launch.ops import use_extensions_dir
    from zero_kit.train.options import TrainOptions
    from zero_kit.train.parent import run_train
    from zero_kit.train.rank import run_planned

    use_extensions_dir()  # before any rank starts: they inherit it (hostfile ranks through the env file)
    planned = run_planned(os.environ)  # a rank of a relaunch: its starting process's plan, not the flags
    return planned if planned is not None else run_train(dataclass_from_args(TrainOptions, args))

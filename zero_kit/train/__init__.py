"""`zero-kit train`: the fine-tuning job (HF Trainer + DeepSpeed ZeRO): its options, its plan, the process that
starts it and its ranks. Checkpoints and the export are packages of their own (zero_kit.checkpoints, zero_kit.export)."""

from zero_kit.errors import EXIT_PREEMPTED
from zero_kit.train.options import TrainOptions

__all__ = ["EXIT_PREEMPTED", "TrainOptions", "run_train"]


def __getattr__(name: str):
    """`run_train` on first use: the starting process's modules stay out of `zero-kit --help` and of every import
    of the options alone."""
    if name == "run_train":
        from zero_kit.train.parent import run_train

        return run_train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""`zero-kit train`: the fine-tuning job (HF Trainer + DeepSpeed ZeRO): its options, its plan, the process that
starts it and its ranks. Checkpoints and the export are packages of their own (zero_kit.checkpoints, zero_kit.export)."""

from zero_kit.errors import EXIT_PREEMPTED
from zero_kit.train.options import TrainOptions
from zero_kit.train.parent import run_train

__all__ = ["EXIT_PREEMPTED", "TrainOptions", "run_train"]

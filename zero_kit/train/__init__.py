"""`zero-kit train`: the fine-tuning job (HF Trainer + DeepSpeed ZeRO), its checkpoints, resume and export."""

from zero_kit.errors import EXIT_PREEMPTED
from zero_kit.export import export_checkpoint
from zero_kit.train.options import TrainOptions
from zero_kit.train.parent import run_train

__all__ = ["EXIT_PREEMPTED", "TrainOptions", "export_checkpoint", "run_train"]

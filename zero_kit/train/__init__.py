"""`zero-kit train`: the fine-tuning job (HF Trainer + DeepSpeed ZeRO), its checkpoints, resume and export."""

from zero_kit.train.export import export_checkpoint
from zero_kit.train.job import run_train
from zero_kit.train.options import EXIT_PREEMPTED, TrainOptions

__all__ = ["EXIT_PREEMPTED", "TrainOptions", "export_checkpoint", "run_train"]

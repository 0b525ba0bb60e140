"""Evaluation and experiment tracking of `zero-kit train` (issue 24 parts 1 and 2), through the HF Trainer's own
machinery: its evaluate() (every rank takes part, which ZeRO-3 needs: each holds a shard of every weight) and its
report_to integrations (TensorBoard, W&B, MLflow).

- Eval data is --eval-data (read, masked and packed as --data is) or --val-size, a seeded hold-out of --data's
  examples; both prepared with the training data (zero_kit.train.rundata).
- eval_loss is the Trainer's: in each eval step the loss over every graded token of all ranks' batches (transformers
  counts the tokens across ranks), then the mean over the eval steps; tests/dist/test_eval_train.py checks it
  against a plain one-process evaluation. eval_perplexity = exp(eval_loss) joins the same log entry, so the
  trackers get it too.
- Evaluations: every --eval-steps, at the last step, and (with --keep-best) before every save, so each checkpoint's
  manifest records the eval loss of its weights (zero_kit.train.checkpoint.best_complete).
"""

from __future__ import annotations

import math

from zero_kit.train.options import TrainOptions, report_targets


def trainer_arguments(opts: TrainOptions, micro_batch: int) -> dict:
    """The TrainingArguments of evaluation and tracking. prediction_loss_only: the eval loop keeps no logits (a
    gather of vocabulary-wide logits from every rank would cost more memory than the model)."""
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


def perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf

"""Long sequences: what a rank holds of one sequence. Sequence parallelism (`--sp`, Ulysses) is the HF Trainer's own
(zero_kit.train.rank.sequence_parallel_arguments); `tiled` slices the MLP and the logits with the loss."""

from __future__ import annotations

from zero_kit.errors import UserError


def check_sp_support(flag: str = "--sp") -> None:
    """The installed accelerate and transformers run Ulysses through the Trainer (accelerate's
    DeepSpeedSequenceParallelConfig, transformers' deepspeed_sp_compute_loss): the oldest supported set (accelerate
    1.11, transformers 4.57) has neither. Refused before any launch, naming what is installed."""
    import importlib.metadata as metadata

    missing = []
    try:
        from accelerate.utils import DeepSpeedSequenceParallelConfig  # noqa: F401
    except ImportError:
        missing.append(f"accelerate {metadata.version('accelerate')} (no DeepSpeedSequenceParallelConfig)")
    try:
        from transformers.integrations.deepspeed import deepspeed_sp_compute_loss  # noqa: F401
    except ImportError:
        missing.append(f"transformers {metadata.version('transformers')} (no deepspeed_sp_compute_loss)")
    if missing:
        raise UserError(f"{flag}: the installed {' and '.join(missing)} cannot run sequence parallelism",
                        "install the newest supported set (constraints/newest.txt), or drop " + flag)  # fmt: skip

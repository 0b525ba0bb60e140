"""Ulysses sequence parallelism in the bench's ZeRO strategies (the `_spN` rows, `zero-kit bench --sp N`): DeepSpeed's
own `UlyssesSPAttentionHF` in place of the model's SDPA, each rank given 1/sp of every row's tokens, and the loss of
the group's whole rows.

It is what the HF Trainer does for `zero-kit train --sp` (accelerate registers the same attention and wraps the data
loader in `UlyssesSPDataLoaderAdapter`; the Trainer weighs the shards' losses), done on the bench's own batches: the
ranks of one group already hold the same rows (DeepSpeedStrategy.data_split), so no batch is gathered, and the
weighting is written here because transformers before 5 has none (`deepspeed_sp_compute_loss`)."""

from __future__ import annotations

from typing import Any

IGNORE = -100
"""The label no loss is taken of (transformers' ignore_index)."""


def register_ulysses(model, options):
    """DeepSpeed's Ulysses attention around the model's own implementation (SDPA in the bench) for every attention
    call of this process, and its process groups: the `mpu` that deepspeed.initialize takes, so that ZeRO partitions
    and reduces over every rank while each group of `options.sequence_parallel` consecutive ranks shares its rows."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation=model.config._attn_implementation,
        sequence_parallel_size=options.sequence_parallel,
        micro_batch_size=options.micro_batch,
        seq_length_is_variable=True,
    )


def sequence_shard(batch: dict[str, Any], rank: int, sp: int) -> dict[str, Any]:
    """Rank `rank` of the group's 1/sp of the micro batch's tokens, cut as UlyssesSPDataLoaderAdapter cuts them:
    input_ids, their global position_ids (Ulysses gathers them to rebuild the causal order) and shift_labels, each
    token's next token with IGNORE after a row's last, so that a slice's last token is scored against the next
    slice's first. `labels` is the same tensor, so the model computes a loss at all. Rows are a multiple of sp long
    (the bench's driver refuses others before launching)."""
    import torch
    import torch.nn.functional as F

    ids = batch["input_ids"]
    rows, length = ids.shape
    chunk = length // sp
    mine = slice(rank * chunk, (rank + 1) * chunk)
    shifted = F.pad(batch["labels"], (0, 1), value=IGNORE)[:, 1:]
    positions = torch.arange(length, device=ids.device).expand(rows, length)
    labels = shifted[:, mine].contiguous()
    return {"input_ids": ids[:, mine].contiguous(), "position_ids": positions[:, mine].contiguous(),
            "labels": labels, "shift_labels": labels}  # fmt: skip


def group_loss(loss, shift_labels, group):
    """The mean loss over the group's whole rows from each rank's mean over its slice: each slice's mean weighed by its
    scored tokens, through differentiable all-gathers, so every rank's backward gets its share (the HF Trainer's
    formula under DeepSpeed SP; a slice with no scored token has a NaN mean and weighs nothing)."""
    import torch
    from torch.distributed.nn.functional import all_gather

    counts = torch.stack(all_gather((shift_labels != IGNORE).sum().to(loss.dtype), group=group))
    losses = torch.stack(all_gather(loss, group=group))
    weighed = torch.where(counts > 0, losses, torch.zeros_like(losses)) * counts
    return weighed.sum() / counts.sum().clamp(min=1)


def with_gradient_scale(loss, scale: float):
    """`loss` with its value and `scale` x its gradient (a hook on a copy: the value is not recomputed, so the loss
    the run logs is the same number)."""
    if scale == 1.0:
        return loss
    scaled = loss.clone()
    scaled.register_hook(lambda grad: grad * scale)
    return scaled

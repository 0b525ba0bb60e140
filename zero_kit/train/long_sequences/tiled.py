"""DeepSpeed's tiled compute for long sequences (ALST: arXiv 2506.13996), put on a Hugging Face causal LM in place,
before DeepSpeed's engine wraps it (`--tiled-compute`; `tile(model)` in a user's own script):

- **MLP** (`tile_mlp`): every decoder layer's `mlp` runs over slices of the sequence through DeepSpeed's TiledMLP,
  which recomputes each slice in backward. The MLP's intermediate tensors (b s I, the widest of a layer) then exist
  for one slice at a time. Slices: ceil(s / h), DeepSpeed's own choice in TiledMLP's docstring.
- **Logits and loss** (`tile_loss`): the vocabulary-wide logits (b s V, upcast to fp32 for the loss: the largest
  tensor of a long sequence) are computed, reduced to the loss and recomputed in backward one slice at a time, through
  DeepSpeed's `sequence_tiled_compute`. While the model trains, its output head hands the final hidden states on
  unchanged and the model's loss function (the `loss_function` every HF causal LM calls with its "logits") does
  the head's work slice by slice; in evaluation and generation the head and the loss are the model's own.

Both recompute in backward with the gradient they are given, so gradient accumulation, DeepSpeed's loss scaling and
the Trainer's weighting of sequence-parallel shards reach every weight. Under ZeRO-3 every slice's call of a
module gathers its weights (DeepSpeed's hooks), and the slice count is the maximum over all ranks, so every rank
gathers as often. The parameter names stay the model's: checkpoints and the export do not change.
"""

from __future__ import annotations

import math


def tile(model, *, mlp: bool = True, loss: bool = True) -> int:
    """Tile `model` (a HF causal LM, or a peft model around one) in place; the MLP modules tiled."""
    tiled = tile_mlp(model) if mlp else 0
    if loss:
        tile_loss(model)
    return tiled


def agreed_slices(wanted: int) -> int:
    """The most slices any rank wants: under ZeRO-3 each slice gathers weights, so every rank must cut as many."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return wanted
    from zero_kit.dist import collective_device

    count = torch.tensor([wanted], dtype=torch.int64, device=collective_device())
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def tile_mlp(model) -> int:
    """Every `*.mlp` module's forward through TiledMLP (the module's own forward on each slice). The slice count is
    agreed once per forward of the model (a pre-hook: one scalar all-reduce, not one per layer, each of which would
    also wait for the GPU), from the length of the sequence every layer sees."""
    base = _causal_lm(model)
    hidden = base.config.hidden_size
    agreed = {"slices": 1}

    def agree(_module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        tokens = ids if ids is not None else kwargs["inputs_embeds"]
        agreed["slices"] = agreed_slices(math.ceil(tokens.shape[1] / hidden))

    count = 0
    for name, module in model.named_modules():
        if name.split(".")[-1] == "mlp" and "forward" not in vars(module):
            module.forward = _tiled_mlp_forward(module, type(module).forward, agreed)
            count += 1
    if count:
        base.register_forward_pre_hook(agree, with_kwargs=True)
    return count


def _tiled_mlp_forward(module, forward, agreed: dict):
    def tiled(x):
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

        if agreed["slices"] <= 1:
            return forward(module, x)
        return TiledMLP.apply(forward, module, x, agreed["slices"], list(module.parameters()))

    return tiled


def tile_loss(model) -> None:
    """The output head passes hidden states on while the model trains; the loss computes logits slice by slice."""
    import torch

    base = _causal_lm(model)
    head = base.get_output_embeddings()
    head_forward = head.forward
    computing = {"head": False}  # True while the loss runs the head on a slice

    def training() -> bool:
        return base.training and torch.is_grad_enabled()

    def forward(x):
        return head_forward(x) if computing["head"] or not training() else x

    model_loss = base.loss_function  # the model's own (HF's LOSS_MAPPING entry for its loss_type)

    def loss_function(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                      **kwargs):  # fmt: skip
        if not training():  # the head ran: these are logits
            return model_loss(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch,
                              ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)  # fmt: skip
        return _tiled_loss(head, computing, logits, labels, shift_labels, vocab_size, num_items_in_batch, ignore_index,
                           base.config.hidden_size)  # fmt: skip

    head.forward = forward
    base.loss_function = loss_function


def _tiled_loss(head, computing, hidden, labels, shift_labels, vocab_size, num_items_in_batch, ignore_index, width):
    """HF's ForCausalLMLoss (fp32 logits, labels shifted unless given shifted; summed over the tokens and divided by
    the batch's label count when the Trainer gives it, else the mean over this batch's labels), one slice at a time."""
    import torch
    import torch.nn.functional as F
    from deepspeed.runtime.sequence_parallel.ulysses_sp import sequence_tiled_compute

    from zero_kit.plan.workload import tile_slices

    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.to(hidden.device)
    batch, length = shift_labels.shape[:2]
    slices = agreed_slices(tile_slices(length, batch, width, vocab_size))  # what the planner counts

    def summed(hidden_states, labels):
        computing["head"] = True
        try:
            logits = head(hidden_states).float()
        finally:
            computing["head"] = False
        return F.cross_entropy(logits.view(-1, vocab_size), labels.reshape(-1), ignore_index=ignore_index,
                               reduction="sum")  # fmt: skip

    total = sequence_tiled_compute(summed, length, slices, {"hidden_states": hidden, "labels": shift_labels}, {},
                                   "hidden_states", list(head.parameters()), output_unshard_dimension=0,
                                   output_reduction="sum")  # fmt: skip
    if num_items_in_batch is None:
        num_items_in_batch = (shift_labels != ignore_index).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _causal_lm(model):
    """The HF causal LM itself (a peft model wraps it as base_model.model)."""
    inner = getattr(getattr(model, "base_model", None), "model", None)
    return inner if inner is not None and hasattr(inner, "get_output_embeddings") and inner is not model else model

"""LoRA for zero-kit train: peft's adapters on the modules --lora-targets names (the family's attention
projections by default)."""

from __future__ import annotations

from zero_kit.errors import UserError
from zero_kit.train.options import TrainOptions


def apply_lora(model, opts: TrainOptions, zero3: bool = False):
    """The model wrapped by peft with --lora-r and friends. Under ZeRO-3 the embeddings' output requires grad: a
    config may gather each decoder layer as one (--leaf-module, zero_kit.config.builder.leaf_module), and DeepSpeed
    hangs a gathered-as-one module's backward on its inputs; layer 0's input comes from the frozen embeddings, so
    without this backward meets layer 0's released, 0-element weights. The cost is layer 0's input gradient (its compute, and
    one micro batch x seq x hidden tensor)."""
    import warnings

    from peft import get_peft_model

    from zero_kit.model import lora_target_modules

    targets = lora_target_modules(opts.lora_targets, model.config.model_type)
    config = lora_config(opts, model.config.model_type)
    try:
        with warnings.catch_warnings():
            # peft >= 0.21 reads model.is_gradient_checkpointing, which transformers >= 5.23 deprecates: their
            # warning, not the user's to act on. Only that message is silenced, only around this call.
            warnings.filterwarnings(
                "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            wrapped = get_peft_model(model, config)
    except ValueError as err:
        raise UserError(f"--lora-targets {','.join(targets)}: {err}", "name Linear modules of the model") from err
    if zero3:
        wrapped.enable_input_require_grads()
    return wrapped


def lora_config(opts: TrainOptions, model_type: str):
    """peft's LoraConfig of --lora-r and friends (the family's attention projections unless --lora-targets)."""
    from peft import LoraConfig

    from zero_kit.model import lora_target_modules

    return LoraConfig(
        r=opts.lora_r,
        lora_alpha=opts.lora_alpha if opts.lora_alpha is not None else 2 * opts.lora_r,
        lora_dropout=opts.lora_dropout,
        target_modules=lora_target_modules(opts.lora_targets, model_type),
        task_type="CAUSAL_LM",
    )

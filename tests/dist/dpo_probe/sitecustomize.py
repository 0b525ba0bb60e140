"""Test hook for tests/dist/test_dpo_train.py, outside the product: with this folder on PYTHONPATH and
ZERO_KIT_PROBE_DPO=DIR, every rank of a `zero-kit train --method dpo` (behind `--nproc` too: Python imports
`sitecustomize` in every interpreter) adds a Trainer callback that reads the DPO reference model when training begins
and when it ends, and writes DIR/rankN.json:

- the reference's parameter elements this rank holds and a sha256 of their bytes (under ZeRO-3 its partitions,
  `ds_tensor`): full fine-tuning, TRL's reference model; LoRA, the base weights of the trained model (every
  parameter but the adapter's), which is what TRL runs with the adapter off;
- the same of the trained model when training begins: full fine-tuning starts where the reference is;
- how TRL prepared the reference: its DeepSpeed engine's ZeRO stage and optimizer, and how many of its parameters
  hold a gradient when training ends;
- whether the reference was precomputed, and the hooks on the trained model's first layer when training begins (a
  precompute's inference engine left alive would add its own ZeRO-3 hooks to the training engine's), and when it
  ends the root module's forward hooks and the module visits in the training engine's ZeRO-3 trace (forward and
  backward, unless the backward still runs through another engine).

It patches nothing unless the variable is set."""

import os

if os.environ.get("ZERO_KIT_PROBE_DPO"):
    import hashlib
    import json
    from pathlib import Path

    from transformers import TrainerCallback

    import zero_kit.train.preference as preference

    def _held(named) -> dict:
        """Elements this rank holds of the (name, parameter) pairs, and a sha256 of their bytes, in name order."""
        digest, count = hashlib.sha256(), 0
        for name, param in sorted(named, key=lambda pair: pair[0]):
            local = param.ds_tensor if hasattr(param, "ds_tensor") else param.data
            digest.update(name.encode())
            digest.update(local.detach().cpu().contiguous().view(-1).numpy().tobytes())
            count += local.numel()
        return {"elements": count, "sha256": digest.hexdigest()}

    def _layer_hooks(module) -> list[int]:
        """Forward pre- and post-hooks on the first decoder layer: ZeRO-3's fetch and release, one set per engine."""
        layer = next(m for name, m in module.named_modules() if name.endswith("layers.0"))
        return [len(layer._forward_pre_hooks), len(layer._forward_hooks)]

    class ReferenceProbe(TrainerCallback):
        def __init__(self, trainer):
            self.trainer, self.record = trainer, {}

        def _reference(self) -> list:
            trainer = self.trainer
            if trainer.ref_model is None:  # LoRA: the base weights of the trained model
                unwrapped = getattr(trainer.model_wrapped, "module", trainer.model)
                return [(n, p) for n, p in unwrapped.named_parameters() if "lora_" not in n]
            return list(getattr(trainer.ref_model, "module", trainer.ref_model).named_parameters())

        def on_train_begin(self, args, state, control, **kwargs):
            trainer, engine = self.trainer, self.trainer.ref_model
            policy = getattr(trainer.model_wrapped, "module", trainer.model)
            self.record = {
                "begin": _held(self._reference()),
                "policy_begin": _held(list(policy.named_parameters())),
                "total": sum(getattr(p, "ds_numel", p.numel()) for _, p in self._reference()),
                "precompute": trainer.args.precompute_ref_log_probs,
                "layer_hooks": _layer_hooks(policy),
                "ref_stage": None if engine is None else engine.zero_optimization_stage(),
                "ref_optimizer": None
                if engine is None or engine.optimizer is None
                else type(engine.optimizer).__name__,
            }

        def on_train_end(self, args, state, control, **kwargs):
            self.record["end"] = _held(self._reference())
            engine, policy = self.trainer.model_wrapped, getattr(self.trainer.model_wrapped, "module", None)
            offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
            # ZeRO-3: how many module visits the training engine's trace holds, forward and backward (a module whose
            # backward function is still bound to another engine is fetched through that engine's coordinator, so
            # its backward is missing from this trace); and the forward hooks on the root module
            self.record["trace_modules"] = None if offload is None else len(
                offload.get_param_coordinator()._PartitionedParameterCoordinator__submodule_order
            )
            self.record["root_hooks"] = [len(policy._forward_pre_hooks), len(policy._forward_hooks)]
            self.record["ref_grads"] = sum(p.grad is not None for _, p in self._reference())
            self.record["steps"] = state.global_step
            out = Path(os.environ["ZERO_KIT_PROBE_DPO"]) / f"rank{args.process_index}.json"
            out.write_text(json.dumps(self.record))

    _dpo_trainer = preference.dpo_trainer

    def _dpo_trainer_with_probe(*args, **kwargs):
        trainer = _dpo_trainer(*args, **kwargs)
        trainer.add_callback(ReferenceProbe(trainer))
        return trainer

    preference.dpo_trainer = _dpo_trainer_with_probe

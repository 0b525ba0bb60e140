"""Each newer LLaMA-style family (issue 24 part 4) trains under ZeRO-3 on two CPU ranks through the real
`deepspeed` launcher and exports a directory that plain transformers reloads: a tiny random model of each (built
here with transformers' own config class and the bundled tokenizer, nothing downloaded), one 2-step run each.
The export is checked against DeepSpeed's own reading of the same checkpoint (zero_to_fp32): same tensors, same
logits, none empty. Phi-3 trains LoRA with its default targets (the fused qkv_proj), the others all weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.jobs import FAST, run, zero_kit
from tests.support.runs import assert_trained, load_safetensors_dir

pytestmark = pytest.mark.dist

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# family: (config class, overrides, LoRA). Gemma and Qwen3 get a head_dim of their own, not hidden / heads.
FAMILIES = {
    "qwen3": ("Qwen3Config", {"head_dim": 32}, False),
    "gemma2": ("Gemma2Config", {"head_dim": 32}, False),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 32}, False),
    "phi3": ("Phi3Config", {}, True),
}
IDS = torch.tensor([[5, 17, 99, 3, 42, 7, 250, 11]])


def _family_dir(family: str, path: Path) -> Path:
    import transformers

    from zero_kit.model import load_tokenizer

    cls, overrides, _ = FAMILIES[family]
    tokenizer = load_tokenizer(None)
    ids = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
               eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    config = getattr(transformers, cls)(vocab_size=len(tokenizer), **TINY, **overrides, **ids)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    assert json.loads((path / "config.json").read_text())["model_type"] == family
    return path


def _deepspeed_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The trained weights as DeepSpeed itself reads the checkpoint (not zero-kit's streaming export)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's, see job
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_trains_under_zero3_and_its_export_reloads(family, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir, out = _family_dir(family, tmp_path / "model"), tmp_path / "out"
    lora = FAMILIES[family][2]
    argv = ["train", "--model", str(model_dir), "--nproc", "2", "--stage", "3", "--max-steps", "2"]
    done = run(zero_kit(*argv, *(["--lora-r", "4"] if lora else []), "--output", str(out), *FAST), timeout=300)
    assert_trained(out, steps=2, world_size=2, stage=3)
    trained = _deepspeed_weights(out / "checkpoint-2")
    final = out / "final"
    if lora:  # the adapter sits on the family's attention projections, fused qkv_proj included
        adapter = json.loads((final / "adapter_config.json").read_text())
        assert sorted(adapter["target_modules"]) == ["o_proj", "qkv_proj"]
        reloaded = AutoModelForCausalLM.from_pretrained(final)  # transformers' own peft integration
        lora_names = [n for n in trained if ".lora_A." in n or ".lora_B." in n]
        assert lora_names and all(".qkv_proj." in n or ".o_proj." in n for n in lora_names)
        reference = _peft_reference(model_dir, trained, adapter)
    else:
        exported = load_safetensors_dir(final)
        assert all(t.numel() > 0 for t in exported.values())  # ZeRO-3 partitions gathered, never empty
        for name, tensor in exported.items():  # the export is DeepSpeed's own reading of the checkpoint
            assert torch.equal(tensor, trained[name]), name
        reloaded, info = AutoModelForCausalLM.from_pretrained(final, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        reference = AutoModelForCausalLM.from_pretrained(model_dir)
        reference.load_state_dict(trained, strict=False)
        initial = AutoModelForCausalLM.from_pretrained(model_dir)
        assert not torch.allclose(_logits(initial), _logits(reloaded))  # two steps changed the weights
    torch.testing.assert_close(_logits(reloaded), _logits(reference))
    assert "step 2/2" in done.stdout


def _peft_reference(model_dir: Path, trained: dict, adapter: dict):
    """The base model with the checkpoint's adapter weights, put in place by peft from DeepSpeed's reading."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = LoraConfig(r=adapter["r"], lora_alpha=adapter["lora_alpha"], target_modules=adapter["target_modules"])
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), config)
    missing = model.load_state_dict(trained, strict=False).missing_keys
    assert not [key for key in missing if ".lora_" in key]
    return model

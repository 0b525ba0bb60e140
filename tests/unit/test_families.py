"""The LLaMA-style families (issue 24 part 4): the planner's shape of each family's config counts exactly the
parameters transformers builds (head_dim, tied embeddings, biases, q/k norms, Gemma's four norms, Phi-3's fused
projections), `zero-kit plan --model DIR` reads a saved directory of each, and LoRA's default targets are real
Linear modules of each family."""

from __future__ import annotations

import json

import pytest
import torch

from zero_kit.cli import main
from zero_kit.errors import UserError
from zero_kit.model import LLAMA_STYLE_TYPES, lora_target_modules
from zero_kit.plan.shapes import SUPPORTED_MODEL_TYPES, shape_from_hf_config

SMALL = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
# (config class, overrides): each family at its defaults, plus the config keys that change the count.
CASES = {
    "llama": ("LlamaConfig", {}),
    "llama-biases": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "mistral": ("MistralConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "qwen3-bias-tied": ("Qwen3Config", {"attention_bias": True, "tie_word_embeddings": True, "head_dim": 32}),
    "gemma2": ("Gemma2Config", {}),
    "gemma3_text": ("Gemma3TextConfig", {}),
    "gemma3-untied": ("Gemma3TextConfig", {"tie_word_embeddings": False, "attention_bias": True}),
    "phi3": ("Phi3Config", {}),
}


def _config(case: str):
    import transformers

    cls, overrides = CASES[case]
    return getattr(transformers, cls)(**{**SMALL, **overrides})


def _meta_model(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_the_model_loader_and_the_planner_accept_the_same_families():
    assert LLAMA_STYLE_TYPES == SUPPORTED_MODEL_TYPES
    assert {"qwen3", "gemma2", "gemma3_text", "phi3"} <= set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_shape_counts_what_transformers_builds(case):
    config = _config(case)
    model = _meta_model(config)
    saved = json.loads(config.to_json_string())  # what save_pretrained writes to config.json
    shape = shape_from_hf_config(saved)
    assert sum(p.numel() for p in model.parameters()) == shape.n_params  # a tied embedding once
    assert shape.param_numels() == [p.numel() for p in model.parameters()]  # DeepSpeed's flattening order
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert shape.largest_layer_params == largest


def test_keys_a_hand_written_config_leaves_out_take_the_family_defaults():
    config = json.loads(_config("gemma2").to_json_string())
    full = shape_from_hf_config(config)
    sparse = {k: v for k, v in config.items() if k not in ("head_dim", "tie_word_embeddings")}
    assert full.head_dim == 256 and full.tie_word_embeddings
    assert shape_from_hf_config(sparse) == full


@pytest.mark.parametrize("case", ["qwen3", "gemma2", "gemma3_text", "phi3", "qwen2"])
def test_plan_reads_a_saved_model_directory(case, tmp_path, capsys):
    config = _config(case)
    config.save_pretrained(tmp_path)
    n_params = sum(p.numel() for p in _meta_model(config).parameters())
    code = main(["plan", "--model", str(tmp_path), "--gpu-mem", "80GB", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["model"]["n_params"] == n_params


def test_an_unsupported_family_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "architectures": ["Gemma3Model"]}))
    code = main(["plan", "--model", str(tmp_path), "--gpu-mem", "80GB"])
    err = capsys.readouterr().err
    assert code != 0
    assert "model_type 'gemma3' (Gemma3Model) is not a supported architecture" in err
    assert "gemma3_text" in err and "phi3" in err and "Traceback" not in err
    with pytest.raises(UserError, match="'bert'"):
        shape_from_hf_config({"model_type": "bert"})


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's, see job
@pytest.mark.parametrize("case", ["llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3"])
def test_default_lora_targets_are_the_family_attention_projections(case):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = _config(case)
    targets = lora_target_modules(None, config.model_type)
    assert targets == (["qkv_proj", "o_proj"] if case == "phi3" else ["q_proj", "k_proj", "v_proj", "o_proj"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=targets, task_type="CAUSAL_LM"))
    adapted = [name.split(".")[-4] for name, _ in lora.named_parameters() if name.endswith("lora_A.default.weight")]
    assert sorted(adapted) == sorted(targets * config.num_hidden_layers)  # each target in every layer
    loss = lora(input_ids=torch.tensor([[3, 4, 5, 6]]), labels=torch.tensor([[3, 4, 5, 6]])).loss
    loss.backward()
    assert all(p.grad is not None for n, p in lora.named_parameters() if p.requires_grad)
    assert lora_target_modules("q_proj, v_proj", "phi3") == ["q_proj", "v_proj"]  # the flag wins

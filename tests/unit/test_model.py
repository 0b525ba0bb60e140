"""The embedded default model and tokenizer, and loading local model directories."""

from __future__ import annotations

import json

import pytest
import torch

from zero_kit.errors import UserError
from zero_kit.model import (
    TINY_DEFAULTS,
    build_config,
    count_parameters,
    load_model,
    load_tokenizer,
    tiny_llama_config,
)


@pytest.fixture(scope="module")
def model():
    return load_model(None, seed=0).eval()


def test_tokenizer_round_trips_text(tokenizer):
    text = "ZeRO stage 3 shards parameters; offload to NVMe at /mnt/nvme. Ünïcödé and 漢字 too!\n\tTabs."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids  # byte-level: nothing is unknown


def test_tokenizer_special_tokens_and_size(tokenizer):
    assert tokenizer.bos_token == "<s>" and tokenizer.eos_token == "</s>" and tokenizer.pad_token == "<pad>"
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    assert 1000 < len(tokenizer) <= 4096
    assert tokenizer("hello")["input_ids"][0] == tokenizer.bos_token_id  # LLaMA-like: a plain call adds bos


def test_chat_template_renders_roles_and_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is ZeRO?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s><|system|>\nBe brief.<|end|><|user|>\nWhat is ZeRO?<|end|><|assistant|>\n"
    conversation = messages + [{"role": "assistant", "content": "Sharding."}]
    ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1  # the template's bos only, no second one from the tokenizer
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") in ids


def test_default_model_is_small_llama(model, tokenizer):
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.hidden_size % model.config.num_attention_heads == 0
    assert 1_000_000 <= count_parameters(model) <= 10_000_000
    assert count_parameters(model) == sum(p.numel() for p in model.parameters())
    assert next(model.parameters()).dtype == torch.float32


def test_default_model_is_deterministic_for_a_seed(model):
    torch.manual_seed(123)
    before = torch.rand(1)
    same = load_model(None, seed=0)
    other = load_model(None, seed=1)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), before)  # load_model leaves the caller's RNG alone
    for (name, a), (_, b) in zip(model.state_dict().items(), same.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(model.model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_tiny_config_keeps_defaults_and_overrides():
    config = tiny_llama_config(vocab_size=100, num_hidden_layers=2)
    assert config.vocab_size == 100 and config.num_hidden_layers == 2
    assert config.hidden_size == TINY_DEFAULTS["hidden_size"]
    assert build_config(None, num_hidden_layers=3).num_hidden_layers == 3


def test_saved_dir_loads_with_identical_logits(model, tokenizer, tmp_path):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path)).eval()
    assert build_config(str(tmp_path)).model_type == "llama"
    batch = tokenizer(["Gradient accumulation sums gradients."], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)
    reloaded_tokenizer = load_tokenizer(str(tmp_path))
    assert reloaded_tokenizer("ZeRO")["input_ids"] == tokenizer("ZeRO")["input_ids"]
    assert reloaded_tokenizer.chat_template == tokenizer.chat_template


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_mistral_and_qwen2_dirs_load_through_the_same_path(tmp_path, tokenizer, family):
    from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config

    config_class = {"mistral": MistralConfig, "qwen2": Qwen2Config}[family]
    # The embedded tiny model's dimensions (one layer) in another family: only the architecture differs.
    config = config_class(vocab_size=len(tokenizer), **{**TINY_DEFAULTS, "num_hidden_layers": 1})
    torch.manual_seed(0)
    original = AutoModelForCausalLM.from_config(config).eval()
    original.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path)).eval()
    assert loaded.config.model_type == family and build_config(str(tmp_path)).model_type == family
    batch = load_tokenizer(str(tmp_path))(["ZeRO-3 with CPU offload."], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(original(**batch).logits, loaded(**batch).logits)


def test_dtype_is_respected(tmp_path):
    model = load_model(None, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model.save_pretrained(tmp_path)
    assert next(load_model(str(tmp_path)).parameters()).dtype == torch.bfloat16  # None keeps the saved dtype
    assert next(load_model(str(tmp_path), dtype=torch.float32).parameters()).dtype == torch.float32


def test_non_llama_dir_is_a_user_error(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="gpt2") as caught:
        build_config(str(tmp_path))
    assert str(tmp_path) in str(caught.value)


@pytest.mark.parametrize(
    "setup, pattern",
    [
        (lambda d: None, "no config.json"),
        (lambda d: (d / "config.json").write_text("{not json"), "cannot read config.json"),
        (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "llama"})), "cannot load the weights"),
    ],
)
def test_broken_model_dirs_are_user_errors(tmp_path, setup, pattern):
    setup(tmp_path)
    with pytest.raises(UserError, match=pattern):
        load_model(str(tmp_path))
    with pytest.raises(UserError, match="no such directory"):
        load_model(str(tmp_path / "missing"))


def test_model_dir_without_tokenizer_files_is_a_user_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="cannot load a tokenizer") as caught:
        load_tokenizer(str(tmp_path))
    assert "save_pretrained" in caught.value.fix

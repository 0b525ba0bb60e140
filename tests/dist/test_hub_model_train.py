"""`zero-kit train --model org/name` (issue 24 part 5) from a Hugging Face cache laid out by huggingface_hub's own
functions (tests/support/hub_cache.py), offline: the run reads the cached snapshot, records that directory (so
`zero-kit export` and a rerun read the same revision), and `zero-kit export` of its checkpoint reloads. One
process, a tiny LLaMA, one step."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.hub_cache import cache_model_dir
from tests.support.jobs import FAST, run, zero_kit
from tests.support.runs import assert_trained, load_safetensors_dir, run_info

pytestmark = pytest.mark.dist
REPO = "tiny-org/tiny-llama"


def test_a_cached_hub_id_trains_and_exports_offline(tmp_path):
    from transformers import LlamaForCausalLM

    from zero_kit.model import load_tokenizer, tiny_llama_config

    source, cache = tmp_path / "source", tmp_path / "home" / "hub"
    config = tiny_llama_config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=1, vocab_size=len(load_tokenizer(None)))  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(source)
    load_tokenizer(None).save_pretrained(source)
    snapshot = cache_model_dir(source, cache, REPO)
    hub_env = {"HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}  # the cache under HF_HOME, no network
    out = tmp_path / "out"
    run(zero_kit("train", "--model", REPO, "--max-steps", "1", "--output", str(out), *FAST), extra_env=hub_env)
    assert_trained(out, steps=1, world_size=1, stage=2)
    assert run_info(out)["options"]["model"] == str(snapshot)
    exported = tmp_path / "exported"
    run(zero_kit("export", str(out / "checkpoint-1"), "--out", str(exported)), extra_env=hub_env)
    assert json.loads((exported / "config.json").read_text())["hidden_size"] == 32
    got, want = load_safetensors_dir(exported), load_safetensors_dir(out / "final")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    reloaded = LlamaForCausalLM.from_pretrained(exported)
    assert sum(p.numel() for p in reloaded.parameters()) == sum(t.numel() for t in got.values())

"""--model by Hub id (issue 24 part 5): `org/name` found in a Hugging Face cache laid out by huggingface_hub's own
functions (tests/support/hub_cache.py) is read like its snapshot directory by the model loaders, the train input
checks and `zero-kit plan`; a missing one is one error naming both ways out. huggingface_hub is kept offline in
every test (its own HF_HUB_OFFLINE constant): nothing here can reach the network."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.hub_cache import COMMIT, cache_model_dir
from zero_kit.cli import main
from zero_kit.errors import UserError
from zero_kit.model import build_config, load_model, load_tokenizer, resolve_model, tiny_llama_config
from zero_kit.train.guards.inputs import check_inputs
from zero_kit.train.options import TrainOptions

REPO = "tiny-org/tiny-llama"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny LLaMA directory as save_pretrained writes it (weights, config, tokenizer)."""
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("source")
    torch.manual_seed(0)
    config = tiny_llama_config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=1, vocab_size=len(load_tokenizer(None)))  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path)
    load_tokenizer(None).save_pretrained(path)
    return path


@pytest.fixture
def hub(tmp_path, monkeypatch, source):
    """An HF_HUB_CACHE holding REPO, zero-kit's default (no HF_HUB_OFFLINE set) and huggingface_hub offline."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    snapshot = cache_model_dir(source, cache, REPO)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the library refuses any request, whatever we ask
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./tiny-org/tiny-llama directory can shadow the id
    return snapshot


def test_the_cache_is_huggingface_hubs_own_layout(hub):
    from huggingface_hub import constants, scan_cache_dir

    info = scan_cache_dir(constants.HF_HUB_CACHE)
    (repo,) = info.repos
    assert repo.repo_id == REPO and not info.warnings
    (revision,) = repo.revisions
    assert revision.commit_hash == COMMIT and revision.refs == {"main"}
    assert {f.file_name for f in revision.files} >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_a_cached_hub_id_loads_as_its_snapshot(hub, source):
    assert resolve_model(REPO) == str(hub)
    assert resolve_model(str(source)) == str(source) and resolve_model(None) is None
    assert build_config(REPO).hidden_size == 32
    got, want = load_model(REPO).state_dict(), load_model(str(source)).state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[name], want[name]) for name in want)
    assert load_tokenizer(REPO).pad_token is not None


def test_train_input_checks_accept_a_cached_hub_id(hub, tmp_path):
    check_inputs(TrainOptions(model=REPO, output=str(tmp_path / "out")))  # no error


def test_a_missing_hub_id_names_both_ways(hub, tmp_path):
    with pytest.raises(UserError) as caught:
        check_inputs(TrainOptions(model="tiny-org/absent", output=str(tmp_path / "out")))
    message = f"{caught.value.message}\n{caught.value.fix}"
    assert "--model tiny-org/absent: no such directory, and not in the Hugging Face cache" in message
    assert "HF_HUB_OFFLINE=0" in message and "local model directory" in message
    with pytest.raises(UserError, match="tiny-org/absent"):
        resolve_model("tiny-org/absent")


def test_with_the_network_allowed_the_checks_leave_the_download_to_the_run(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    check_inputs(TrainOptions(model="tiny-org/absent", output=str(tmp_path / "out")))  # fetched after the checks
    with pytest.raises(UserError) as caught:  # the library is offline here: the download fails, said plainly
        resolve_model("tiny-org/absent")
    assert "check the name/network" in caught.value.fix and "local model directory" in caught.value.fix


def test_plan_reads_a_cached_hub_id(hub, capsys):
    n_params = sum(p.numel() for p in load_model(str(hub)).parameters())
    code = main(["plan", "--model", REPO, "--gpu-mem", "80GB", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["model"]["n_params"] == n_params


def test_plan_refuses_a_missing_hub_id_in_one_error(hub, capsys):
    code = main(["plan", "--model", "tiny-org/absent", "--gpu-mem", "80GB"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "error: --model tiny-org/absent: no such directory, and not in the Hugging Face cache" in err
    assert "HF_HUB_OFFLINE=0" in err and "local model directory" in err

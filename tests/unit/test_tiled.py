"""`--tiled-compute` (zero_kit.train.long_sequences.tiled): DeepSpeed's TiledMLP and sequence_tiled_compute on a real
HF causal LM (the embedded tiny LLaMA, h=192, so 512 tokens are 3 slices) give the model's own loss and gradients
within float rounding, with the gradient the loss is given (scaled, as accumulation and loss scaling do), and leave
evaluation's logits, the parameter names and the loss of DPO alone."""

from __future__ import annotations

import copy

import pytest
import torch

from zero_kit.errors import UserError
from zero_kit.model import load_model
from zero_kit.train.long_sequences.tiled import tile
from zero_kit.train.options import TrainOptions, check_options


def _batch(length: int = 512):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1800, (2, length), generator=gen)
    labels = ids.clone()
    labels[0, :100] = -100  # a prompt left out of the loss
    labels[1, -37:] = -100  # padding
    return ids, labels


def _loss_and_grads(model, ids, labels, scale=1.0, **extra):
    model.zero_grad()
    loss = model(input_ids=ids, labels=labels, **extra).loss
    (loss * scale).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_tiled_mlp_and_loss_give_the_models_loss_and_gradients(scale, monkeypatch):
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    calls = []
    apply = TiledMLP.apply
    monkeypatch.setattr(TiledMLP, "apply", lambda *args: calls.append(args[3]) or apply(*args))
    plain = load_model(None, seed=0)
    tiled = copy.deepcopy(plain)
    assert tile(tiled) == plain.config.num_hidden_layers
    ids, labels = _batch()
    want_loss, want = _loss_and_grads(plain, ids, labels, scale)
    got_loss, got = _loss_and_grads(tiled, ids, labels, scale)
    assert calls == [3] * plain.config.num_hidden_layers  # every MLP in ceil(512 / 192) slices
    assert torch.allclose(got_loss, want_loss, rtol=1e-6, atol=1e-6), (got_loss, want_loss)
    assert got.keys() == want.keys() and want
    for name, grad in want.items():
        assert torch.allclose(got[name], grad, rtol=1e-4, atol=1e-6), name


def test_shifted_labels_and_the_trainers_token_count_are_honoured():
    plain = load_model(None, seed=0)
    tiled = copy.deepcopy(plain)
    tile(tiled)
    ids, labels = _batch()
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()  # as Ulysses' adapter does
    count = torch.tensor(900)
    want, _ = _loss_and_grads(plain, ids, labels, shift_labels=shifted, num_items_in_batch=count)
    got, _ = _loss_and_grads(tiled, ids, labels, shift_labels=shifted, num_items_in_batch=count)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)


def test_evaluation_keeps_the_logits_and_names_do_not_change():
    plain = load_model(None, seed=0)
    tiled = copy.deepcopy(plain)
    tile(tiled)
    assert [n for n, _ in tiled.named_parameters()] == [n for n, _ in plain.named_parameters()]
    ids, labels = _batch(64)
    tiled.eval()
    with torch.no_grad():
        out = tiled(input_ids=ids, labels=labels)
        reference = plain.eval()(input_ids=ids, labels=labels)
    assert out.logits.shape == (2, 64, plain.config.vocab_size)
    assert torch.allclose(out.logits, reference.logits, atol=1e-6) and torch.allclose(out.loss, reference.loss)


def test_dpo_refuses_it():
    with pytest.raises(UserError, match="--tiled-compute with --method dpo"):
        check_options(TrainOptions(tiled_compute=True, method="dpo"))

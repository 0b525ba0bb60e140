"""The pure parts of the tensor/pipeline-parallel benchmark strategies: how a pipeline cuts the layers, which rows of
the global batch a model-parallel rank trains on, how the byte counter books a point-to-point send, and what the
bench refuses before launching."""

from __future__ import annotations

import pytest

from zero_kit.bench.options import BenchOptions
from zero_kit.bench.worker import rank_micro_batches, synthetic_rows
from zero_kit.errors import UserError
from zero_kit.metrics import _peer, ring_bytes
from zero_kit.plan.parallel import stage_layers
from zero_kit.strategies import STRATEGIES, check_model_parallel
from zero_kit.strategies.pipeline import layer_split


@pytest.mark.parametrize(("layers", "stages"), [(2, 2), (6, 2), (7, 3), (5, 5)])
def test_layer_split_is_contiguous_and_the_planners(layers, stages):
    bounds = layer_split(layers, stages)
    assert bounds[0][0] == 0 and bounds[-1][1] == layers
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert [end - start for start, end in bounds] == stage_layers(layers, stages)


def test_layer_split_refuses_more_stages_than_layers():
    with pytest.raises(ValueError, match="cannot cut 1 decoder layers into 2"):
        layer_split(1, 2)


def test_model_parallel_ranks_train_on_the_rows_of_the_same_global_batch():
    opts = BenchOptions(micro_batch=2, grad_accum=2, seq_len=8, vocab_size=64)
    world = 2
    every = synthetic_rows(3, 2 * 2 * world, 8, 64, opts.seed)
    ddp = [rank_micro_batches(3, opts, (rank, world, 2), world, 64) for rank in range(world)]
    # tp (one data-parallel rank, micro batches of 2 x 2 rows) and pp (one call, all rows): the whole global batch
    tp = rank_micro_batches(3, opts, (0, 1, 2), world, 64)
    pp = rank_micro_batches(3, opts, (0, 1, 1), world, 64)
    assert [b["input_ids"].shape[0] for b in tp] == [4, 4] and pp[0]["input_ids"].shape[0] == 8
    rows = lambda batches: sorted(map(tuple, (r.tolist() for b in batches for r in b["input_ids"])))  # noqa: E731
    assert rows(tp) == rows(pp) == rows([b for rank in ddp for b in rank]) == sorted(map(tuple, every.tolist()))


def test_a_send_counts_its_bytes_once_toward_its_receiver():
    assert ring_bytes("p2p", 1000, 2) == 1000.0
    assert _peer((None, 3), {}) == ("global", 3)
    assert _peer((None,), {"dst": 1}) == ("global", 1)
    assert _peer((None,), {"group_dst": 0, "group": "g"}) == ("group", 0)
    assert _peer((None,), {}) is None


def test_the_bench_refuses_splits_the_backends_cannot_make_before_launching():
    pp, tp = STRATEGIES["pp"], STRATEGIES["zero1_tp"]
    check_model_parallel(pp, 4, 2, 2, False, grad_accum=2)  # PP2 x DP2, 4 micro-batches
    with pytest.raises(UserError, match="gets only 2 micro-batches, one per stage") as refused:
        check_model_parallel(pp, 4, 2, 2, False)  # PP2 x DP2 at grad_accum 1: DDP's reducer fails on step 2
    assert "--grad-accum 2 or more" in refused.value.fix
    check_model_parallel(tp, 2, 2, 2, False)
    with pytest.raises(UserError) as refused:
        check_model_parallel(pp, 3, 1, 2, True)
    message = str(refused.value.message)
    assert message.startswith("3 problems before launching")
    assert "--nproc a multiple of 2, got 3" in message and "2 stages: it has 1 layers" in message
    assert "tie_word_embeddings" in message
    with pytest.raises(UserError, match="AutoTP cannot split 3 KV heads 2 ways") as refused:
        check_model_parallel(tp, 2, 2, 3, False)
    assert "multiple of 2" in refused.value.fix

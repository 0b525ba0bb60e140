"""Test hook for test_third_party_clients.py's sequence-parallel runs, outside the product: a test that puts this
folder on PYTHONPATH and sets ZERO_KIT_PROBE_SP_SHARDS=DIR gets, in every rank (a process its launcher gave a RANK),
one JSON line in DIR/rank<RANK>.jsonl per batch DeepSpeed's UlyssesSPDataLoaderAdapter hands that rank: the
position_ids of its first row, i.e. which part of the gathered sequence the rank holds. The client scripts (accelerate's
ALST script, `trl sft`) stay as they are; this patches nothing unless the variable is set."""

import os

if os.environ.get("ZERO_KIT_PROBE_SP_SHARDS") and os.environ.get("RANK") is not None:
    import json

    from deepspeed.runtime.sequence_parallel import ulysses_sp

    _next_shard = ulysses_sp.UlyssesSPDataLoaderAdapter.__next__

    def _next_shard_recorded(self):
        batch = _next_shard(self)
        shards = os.path.join(os.environ["ZERO_KIT_PROBE_SP_SHARDS"], f"rank{os.environ['RANK']}.jsonl")
        with open(shards, "a") as out:
            out.write(json.dumps(batch["position_ids"][0].tolist()) + "\n")
        return batch

    ulysses_sp.UlyssesSPDataLoaderAdapter.__next__ = _next_shard_recorded

"""One DeepSpeed engine on one CPU rank, for tests/unit/test_accounting.py: what ZeRO really allocates and keeps.

    python tests/unit/zero_buffers_probe.py STAGE DEVICE PORT [ZERO_OVERRIDES_JSON]

Builds the generator's config for STAGE and DEVICE (cpu: no overlap_comm at ZeRO-1/2; cuda: the GPU config, which
runs on CPU all the same) for a 2-layer LLaMA of hidden 64, trains two steps, and prints one JSON line:
- `bucket`: the config's reduce_bucket_size, `buffers`: the elements of each reduce bucket buffer DeepSpeed holds
  during backward (ZeRO-1/2: read just before it releases them after the step; ZeRO-3: its ipg buffers);
- ZeRO-3: `params` (Ψ) and `kept`, the parameter elements still gathered after the second step's forward (the
  first step traces the modules' order; from then on parameters reused within the reuse distance stay gathered)."""

from __future__ import annotations

import json
import os
import sys

stage, device, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
overrides = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)

import deepspeed  # noqa: E402
import torch  # noqa: E402
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from zero_kit.config.builder import build_ds_config  # noqa: E402
from zero_kit.config.spec import ZeroSpec  # noqa: E402

deepspeed.init_distributed("gloo")
spec = ZeroSpec(stage=stage, device=device, hidden_size=64, world_size=1, micro_batch=1, precision="fp32")
config = build_ds_config(spec)
config["zero_optimization"].update(overrides)
config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}
torch.manual_seed(0)
shape = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, vocab_size=256)  # fmt: skip
model = LlamaForCausalLM(shape)
params = sum(p.numel() for p in model.parameters())
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
held: list[int] = []
if stage != 3:
    release = optimizer._release_ipg_buffers

    def recording_release():
        held[:] = [t.numel() for bucket in optimizer.ipg_buckets.values() for t in bucket.buffer]
        release()

    optimizer._release_ipg_buffers = recording_release
ids = torch.randint(0, 256, (1, 16))
out = {"bucket": config["zero_optimization"]["reduce_bucket_size"]}
for step in range(2):
    loss = engine(input_ids=ids, labels=ids).loss
    if stage == 3 and step == 1:
        out["params"] = params
        out["kept"] = sum(p.ds_numel for p in engine.module.parameters() if p.ds_status == ZeroParamStatus.AVAILABLE)
    engine.backward(loss)
    engine.step()
if stage == 3:
    held = [bucket.buffer.numel() for bucket in optimizer.ipg_buckets.values() if bucket.buffer is not None]
print(json.dumps({**out, "buffers": held}))

"""Issue 23 part 3 at unit level: export reads a ZeRO checkpoint as byte ranges of its files and writes safetensors
a tensor at a time. The checkpoints here are written in DeepSpeed's on-disk layout (per-rank flat fp32 partitions,
param_shapes, `latest`) from real weights, at world sizes and sizes that leave padding; DeepSpeed's own reader
(`get_fp32_state_dict_from_zero_checkpoint`) reads the same files as the reference, bitwise. Real ZeRO checkpoints
are exported and compared in tests/dist (test_families_train: ZeRO-3; test_resume_zero2: ZeRO-2)."""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from zero_kit.export import writer
from zero_kit.export.reader import FileTensor, read_zero_checkpoint


def _zero_checkpoint(root: Path, weights: dict, world: int, stage: int) -> Path:
    """checkpoint-1 of `weights` (name -> fp32 tensor) as DeepSpeed saves ZeRO-`stage` at `world` ranks."""
    shard_dir = root / "checkpoint-1" / "global_step1"
    shard_dir.mkdir(parents=True)
    (root / "checkpoint-1" / "latest").write_text("global_step1")
    shapes = [{name: t.shape for name, t in weights.items()}]
    if stage == 3:  # each parameter: ceil(numel / world) elements of every rank's flat partition, zero padded
        parts = [[] for _ in range(world)]
        for tensor in weights.values():
            size = math.ceil(tensor.numel() / world)
            padded = torch.cat([tensor.flatten(), torch.zeros(size * world - tensor.numel())])
            for rank in range(world):
                parts[rank].append(padded[rank * size : (rank + 1) * size])
        flats = {rank: {"fp32_flat_groups": [torch.cat(parts[rank])]} for rank in range(world)}
    else:  # the group's parameters end to end, padded to 2 * world, then split evenly over the ranks
        whole = torch.cat([t.flatten() for t in weights.values()])
        whole = torch.cat([whole, torch.zeros(-whole.numel() % (2 * world))])
        flats = {rank: {"single_partition_of_fp32_groups": [p.clone()]} for rank, p in enumerate(whole.chunk(world))}
    for rank in range(world):
        optim = {"zero_stage": stage, "partition_count": world, **flats[rank]}
        torch.save({"optimizer_state_dict": optim}, shard_dir / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    for name in [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world)] if stage == 3 else ["mp"]:
        model_states = {"module": {}, "buffer_names": [], "param_shapes": shapes, "shared_params": {},
                        "frozen_param_shapes": None, "frozen_param_fragments": None, "ds_version": "0.19"}  # fmt: skip
        torch.save(model_states, shard_dir / (name if stage == 3 else "mp_rank_00_model_states.pt"))
    return root / "checkpoint-1"


def _weights(seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    shapes = {"embed.weight": (37, 12), "layer.bias": (5,), "scalar": (1,), "layer.weight": (7, 11), "odd": (13,)}
    return {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}


def _deepspeed_reading(checkpoint: Path) -> dict:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_reader_gives_deepspeed_reading_bitwise(tmp_path, stage, world):
    weights = _weights()
    ckpt = _zero_checkpoint(tmp_path, weights, world, stage)
    mine, reference = read_zero_checkpoint(ckpt), _deepspeed_reading(ckpt)
    assert list(mine) == list(reference) == list(weights)
    for name, tensor in reference.items():
        assert isinstance(mine[name], FileTensor)
        assert torch.equal(mine[name].contiguous(), tensor) and torch.equal(tensor, weights[name]), name


def _entries(tensors: dict) -> list:
    return [(name, t, t.dtype) for name, t in tensors.items()]


def test_write_shard_is_what_safetensors_reads(tmp_path):
    tensors = {"w": torch.randn(3, 4), "half": torch.randn(6).bfloat16(), "f16": torch.randn(2, 2).half(),
               "steps": torch.arange(5), "mask": torch.tensor([True, False, True]), "scalar": torch.tensor(2.5)}  # fmt: skip
    path = tmp_path / "model.safetensors"
    writer.write_shard(path, _entries(tensors), lambda name, t, dtype: t.to(dtype))
    back = load_file(str(path))
    assert list(back) == list(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}  # what transformers' from_pretrained checks


@pytest.mark.parametrize("in_kernel", [True, False])
def test_fp32_parameters_go_file_to_file(tmp_path, monkeypatch, in_kernel):
    """An fp32 export never materializes a trained parameter in this process: its bytes are copied from the shard
    files to the output (copy_file_range, or a bounded buffer where the kernel refuses it), bitwise."""
    weights = _weights(1)
    ckpt = _zero_checkpoint(tmp_path, weights, 2, 3)
    lazy = read_zero_checkpoint(ckpt)
    monkeypatch.setattr(writer, "_copy_file_range_works", in_kernel)
    monkeypatch.setattr(FileTensor, "contiguous", lambda self: pytest.fail("an fp32 parameter was materialized"))
    path = tmp_path / "model.safetensors"
    writer.write_shard(path, [(name, t, torch.float32) for name, t in lazy.items()], None)
    back = load_file(str(path))
    assert all(torch.equal(back[name], tensor) for name, tensor in weights.items())


def test_converting_export_holds_one_tensor_at_a_time(tmp_path, monkeypatch):
    """--dtype bf16 over several output shards: at any moment at most one parameter is materialized (its fp32 value
    and its bf16 copy), whatever the model or shard size; counted on the live tensors themselves."""
    from zero_kit.export import to_hf

    weights = _weights(2)
    live, peak = [0], [0]

    def tracked(tensor):
        nbytes = tensor.numel() * tensor.element_size()
        live[0] += nbytes
        peak[0] = max(peak[0], live[0])
        weakref.finalize(tensor, lambda: live.__setitem__(0, live[0] - nbytes))
        return tensor

    original = FileTensor.contiguous
    monkeypatch.setattr(FileTensor, "contiguous", lambda self: tracked(original(self)))
    convert = to_hf._convert
    monkeypatch.setattr(to_hf, "_convert", lambda *args: tracked(convert(*args)))
    lazy = read_zero_checkpoint(_zero_checkpoint(tmp_path, weights, 2, 3))
    plan = to_hf._plan_shards(list(lazy.items()), None, "bf16", max_bytes=100)
    assert len(plan) >= 3  # several output shards
    to_hf._write_shards(plan, tmp_path, "model", None)
    largest = max(t.numel() for t in weights.values())
    assert 0 < peak[0] <= largest * (4 + 2), (peak[0], largest)
    back = {}
    for file in sorted(tmp_path.glob("model-*.safetensors")):
        back.update(load_file(str(file)))
    assert all(torch.equal(back[name], tensor.bfloat16()) for name, tensor in weights.items())


def test_a_cut_shard_is_said_plainly(tmp_path):
    from zero_kit.errors import UserError

    ckpt = _zero_checkpoint(tmp_path, _weights(), 2, 3)
    lazy = read_zero_checkpoint(ckpt)
    optim = ckpt / "global_step1" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    end = lazy["embed.weight"].segments[-1].offset + 8  # rank 1's part of the first parameter, cut after 2 floats
    optim.write_bytes(optim.read_bytes()[:end])
    with pytest.raises(UserError, match="rank_1_mp_rank_00_optim_states.pt"):
        writer.write_shard(tmp_path / "m.safetensors", [(n, t, torch.float32) for n, t in lazy.items()], None)

"""A ZeRO checkpoint (stage 1-3) read as byte ranges of its files, for zero_kit.export.to_hf.

Nothing of the optimizer shards is read here: each shard is unpickled with map_location="meta" (weights_only, no
code runs), which gives every flat fp32 partition's offset in its file, and every trained parameter becomes a
`FileTensor`: its shape and the ranges of the ranks' files that hold it, in order. The export then reads one tensor
at a time (or copies the ranges file to file), so memory no longer follows the model size, nor even the shard
size; DeepSpeed's zero_to_fp32 maps the shards and materializes a whole output shard. The layout is DeepSpeed's
(deepspeed/utils/zero_to_fp32.py documents it): ZeRO-3 gives each parameter ceil(numel / world) elements of
every rank's flat partition, ZeRO-1/2 lays the parameters end to end over the ranks' partitions of each group.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from zero_kit.errors import UserError

FIX = "export a checkpoint-N of ZeRO stage 1-3 written by zero-kit train"


class _DeepSpeedRecord:
    """Stands in for a record class DeepSpeed pickles into its shards: its fields load as plain data, and neither
    DeepSpeed nor any of its code is imported to read them."""


# The globals DeepSpeed itself pickles into ZeRO checkpoints (loss scaler, fragment addresses, the stage enum),
# allowed by name with stand-ins (the stage enum is an int); any other global is refused, never imported or called.
SAFE_DEEPSPEED_GLOBALS = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": _DeepSpeedRecord,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": _DeepSpeedRecord,
    "deepspeed.utils.tensor_fragment.fragment_address": _DeepSpeedRecord,
    "deepspeed.runtime.zero.config.ZeroStageEnum": int,
}


@dataclass(frozen=True)
class Segment:
    """`nbytes` bytes at `offset` of the file `path`."""

    path: str
    offset: int
    nbytes: int


@dataclass
class FileTensor:
    """One full fp32 parameter as ranges of the ranks' optimizer files, read only when its turn comes."""

    shape: tuple[int, ...]
    segments: list[Segment]

    @property
    def dtype(self):
        import torch

        return torch.float32

    def contiguous(self):
        import torch

        tensor = torch.empty(math.prod(self.shape), dtype=torch.float32)
        target = memoryview(tensor.numpy()).cast("B")
        position = 0
        for segment in self.segments:
            with open(segment.path, "rb", buffering=0) as source:
                position += _read_exact(source.fileno(), target[position : position + segment.nbytes], segment)
        return tensor.view(self.shape)


def _read_exact(fd: int, target: memoryview, segment: Segment) -> int:
    done = 0
    while done < segment.nbytes:
        got = os.preadv(fd, [target[done:]], segment.offset + done)
        if got == 0:
            raise cut_short(segment)
        done += got
    return done


def cut_short(segment: Segment) -> UserError:
    return UserError(
        f"{segment.path}: ends before byte {segment.offset + segment.nbytes}", "export a complete checkpoint"
    )


def read_zero_checkpoint(checkpoint_dir: Path) -> dict:
    """name -> FileTensor (trained parameters), or a tensor mapped from the model-state files (buffers, frozen
    parameters); tied names share one object. Damaged or foreign checkpoints raise UserError."""
    shard_dir = _shard_dir(Path(checkpoint_dir))
    model_states = [_load(path, mmap=True) for path in _files(shard_dir, "*_model_states.pt")]
    optim_files = _files(shard_dir, "*_optim_states.pt")
    optim = [_load(path, map_location="meta")["optimizer_state_dict"] for path in optim_files]
    stage, world = _stage_and_world(optim, len(optim_files), shard_dir)
    first = model_states[0]
    state = {name: _float(t) for name, t in first["module"].items() if name in first["buffer_names"]}
    paths = [str(path) for path in optim_files]
    if stage == 3:
        state.update(_frozen_zero3(model_states, world))
        state.update(_trainable_zero3(first["param_shapes"], [o["fp32_flat_groups"] for o in optim], paths))
    else:
        state.update(first.get("frozen_param_fragments") or {})
        groups = [o["single_partition_of_fp32_groups"] for o in optim]
        state.update(_trainable_zero12(first["param_shapes"], groups, paths, optim[0].get("param_alignment_paddings")))
    for name, source in first["shared_params"].items():
        if source in state:
            state[name] = state[source]
    return state


def _shard_dir(checkpoint_dir: Path) -> Path:
    latest = checkpoint_dir / "latest"
    if not latest.is_file():
        raise UserError(f"{checkpoint_dir}: cannot read the ZeRO shards (no 'latest' file)", FIX)
    shard_dir = checkpoint_dir / latest.read_text(encoding="utf-8").strip()
    if not shard_dir.is_dir():
        raise UserError(f"{checkpoint_dir}: cannot read the ZeRO shards ({shard_dir.name} is missing)", FIX)
    return shard_dir


def _files(shard_dir: Path, pattern: str) -> list[Path]:
    def rank_order(path: Path) -> list:
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]

    found = sorted(shard_dir.glob(pattern), key=rank_order)
    if not found:
        raise UserError(f"{shard_dir}: cannot read the ZeRO shards (no {pattern} files)", FIX)
    return found


def _stage_and_world(optim: list[dict], files: int, shard_dir: Path) -> tuple[int, int]:
    if "zero_stage" not in optim[0]:
        raise UserError(f"{shard_dir}: cannot read the ZeRO shards (not a ZeRO checkpoint)", FIX)
    stage, world = int(optim[0]["zero_stage"]), optim[0]["partition_count"]
    world = max(world) if isinstance(world, list) else int(world)
    if world != files or stage not in (1, 2, 3):
        raise UserError(
            f"{shard_dir}: cannot read the ZeRO shards (stage {stage}, {world} ranks, {files} optimizer files)",
            "export a complete checkpoint: every rank's *_optim_states.pt, from one save",
        )
    return stage, world


def _float(tensor):
    return tensor.float() if tensor.is_floating_point() else tensor


def _load(path: Path, **kwargs) -> dict:
    """torch.load with weights_only=True and DeepSpeed's record classes allowed as stand-ins: a planted pickle in a
    checkpoint cannot run code; a shard torch cannot read is said plainly."""
    import pickle

    import torch

    allowed = [(stand_in, name) for name, stand_in in SAFE_DEEPSPEED_GLOBALS.items()]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(str(path), weights_only=True, **kwargs)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = found.group(1) if found else str(err).splitlines()[0]
        raise UserError(
            f"{path}: a ZeRO shard holds an object that is not plain data ({what}); export reads shards with "
            "torch.load(weights_only=True) and never runs code a checkpoint carries",
            "export a checkpoint written by zero-kit train with this DeepSpeed version",
        ) from None
    except (RuntimeError, OSError, EOFError) as err:
        raise UserError(f"{path}: cannot read this ZeRO shard ({str(err).splitlines()[0]})", FIX) from None


def _file_offset(tensor) -> int:
    """Where a tensor loaded with map_location="meta" starts in its file (torch records each storage's offset)."""
    offset = getattr(tensor.untyped_storage(), "_checkpoint_offset", None)
    if offset is None:
        raise UserError("this torch does not record storage offsets when loading to meta", "use torch >= 2.6")
    return offset + tensor.storage_offset() * tensor.element_size()


def _trainable_zero3(param_shapes: list[dict], flat_groups: list[list], paths: list[str]) -> dict:
    """Each parameter: partition = ceil(numel / world) elements at the same offset of every rank's flat groups
    (laid end to end); rank r holds elements r*partition onwards, the last ones padded."""
    world = len(paths)
    ranks = [_Flat(groups, path) for groups, path in zip(flat_groups, paths, strict=True)]
    state, offset = {}, 0
    for name, shape in ((n, s) for shapes in param_shapes for n, s in shapes.items()):
        numel, partition = math.prod(shape), math.ceil(math.prod(shape) / world)
        segments = []
        for rank, flat in enumerate(ranks):
            take = max(0, min(partition, numel - rank * partition))
            segments += flat.ranges(offset, take)
        state[name] = FileTensor(tuple(shape), segments)
        offset += partition
    if offset != ranks[0].numel:
        raise UserError(f"{paths[0]}: the parameters take {offset} elements of {ranks[0].numel} per rank", FIX)
    return state


def _trainable_zero12(param_shapes: list[dict], groups: list[list], paths: list[str], paddings) -> dict:
    """Each parameter group is the ranks' partitions end to end; its parameters follow each other in it (with the
    alignment padding DeepSpeed records after each, if any)."""
    state = {}
    for index, shapes in enumerate(param_shapes):
        whole = _Concat([_Flat([rank_groups[index]], path) for rank_groups, path in zip(groups, paths, strict=True)])
        offset = 0
        for position, (name, shape) in enumerate(shapes.items()):
            numel = math.prod(shape)
            state[name] = FileTensor(tuple(shape), whole.ranges(offset, numel))
            offset += numel + (paddings[index][position] if paddings is not None else 0)
        align = 2 * len(paths)
        if math.ceil(offset / align) * align != math.ceil(whole.numel / align) * align:
            raise UserError(f"{paths[0]}: group {index} takes {offset} elements of {whole.numel}", FIX)
    return state


def _frozen_zero3(model_states: list[dict], world: int) -> dict:
    """Frozen parameters (kept out of the optimizer): each rank's fragment, end to end, cut to the full size."""
    import torch

    shapes = model_states[0].get("frozen_param_shapes") or {}
    frozen = {}
    for name, shape in shapes.items():
        fragments = [states["frozen_param_fragments"][name] for states in model_states[:world]]
        frozen[name] = torch.cat(fragments, 0).narrow(0, 0, math.prod(shape)).view(shape)
    return frozen


class _Flat:
    """One rank's flat fp32 groups, end to end, as ranges of its file."""

    def __init__(self, groups: list, path: str):
        import torch

        if any(group.dtype != torch.float32 for group in groups):
            raise UserError(f"{path}: the flat partitions are not fp32", FIX)
        self.pieces = [(_file_offset(group), group.numel()) for group in groups]
        self.path, self.numel = path, sum(numel for _, numel in self.pieces)

    def ranges(self, start: int, count: int) -> list[Segment]:
        segments, base = [], 0
        for file_offset, numel in self.pieces:
            lo, hi = max(start, base), min(start + count, base + numel)
            if lo < hi:
                segments.append(Segment(self.path, file_offset + 4 * (lo - base), 4 * (hi - lo)))
            base += numel
        return segments


class _Concat(_Flat):
    """Several ranks' flat pieces end to end (a ZeRO-1/2 group)."""

    def __init__(self, flats: list[_Flat]):
        self.flats, self.numel = flats, sum(flat.numel for flat in flats)

    def ranges(self, start: int, count: int) -> list[Segment]:
        segments, base = [], 0
        for flat in self.flats:
            lo, hi = max(start, base), min(start + count, base + flat.numel)
            if lo < hi:
                segments += flat.ranges(lo - base, hi - lo)
            base += flat.numel
        return segments

"""Writes one safetensors file a tensor at a time, for zero_kit.export.to_hf.

safetensors' own `save_file` takes a dict of whole tensors and copies each into a bytes object first, so it holds
the shard twice; the format is simple (an 8-byte little-endian header length, a JSON header of dtype, shape and
byte range per tensor, then the bytes), so the header is written from the shapes and each tensor after it, one
at a time. An fp32 parameter read from the ZeRO shards is copied file to file (copy_file_range): its bytes never
pass through this process's memory.
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path

from zero_kit.export.reader import FileTensor, Segment, cut_short

CHUNK_BYTES = 64 * 2**20  # a plain read/write copy's buffer, where copy_file_range is refused


def _codes() -> dict:
    import torch

    return {
        torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
        torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
        torch.bool: "BOOL",
    }  # fmt: skip


def header_bytes(entries: list[tuple[str, object, object]]) -> bytes:
    """The length prefix and JSON header for (name, source, output dtype) entries, in that order in the file."""
    import torch

    codes, header, offset = _codes(), {"__metadata__": {"format": "pt"}}, 0
    for name, source, dtype in entries:
        nbytes = math.prod(source.shape) * (torch.finfo(dtype).bits if dtype.is_floating_point else _bits(dtype)) // 8
        header[name] = {"dtype": codes[dtype], "shape": list(source.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(blob)) + blob


def _bits(dtype) -> int:
    import torch

    return 8 if dtype == torch.bool else torch.iinfo(dtype).bits


def write_shard(path: Path, entries: list[tuple[str, object, object]], materialize: Callable) -> None:
    """`entries`: (name, source, output dtype); `materialize(name, source, dtype)` gives the tensor to write (it
    checks it). Holds at most one tensor at a time."""
    import torch

    with open(path, "wb", buffering=0) as out:
        _write_all(out.fileno(), memoryview(header_bytes(entries)))
        for name, source, dtype in entries:
            if isinstance(source, FileTensor) and dtype == torch.float32:
                for segment in source.segments:
                    _copy(segment, out.fileno())
                continue
            tensor = materialize(name, source, dtype)
            if tensor.numel():
                _write_all(out.fileno(), memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
            del tensor  # written: free it before the next one


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


_NO_COPY_FILE_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.EPERM}
_copy_file_range_works = hasattr(os, "copy_file_range")


def _copy(segment: Segment, out_fd: int) -> None:
    """Append the segment's bytes to `out_fd`: in the kernel where it can, else through a bounded buffer."""
    global _copy_file_range_works
    with open(segment.path, "rb", buffering=0) as source:
        done = 0
        while _copy_file_range_works and done < segment.nbytes:
            try:
                copied = os.copy_file_range(source.fileno(), out_fd, segment.nbytes - done, segment.offset + done)
            except OSError as err:
                if err.errno not in _NO_COPY_FILE_RANGE:
                    raise
                _copy_file_range_works = False  # e.g. another filesystem on an old kernel: copy by hand from here
                break
            if copied == 0:
                raise cut_short(segment)
            done += copied
        while done < segment.nbytes:
            chunk = os.pread(source.fileno(), min(CHUNK_BYTES, segment.nbytes - done), segment.offset + done)
            if not chunk:
                raise cut_short(segment)
            _write_all(out_fd, memoryview(chunk))
            done += len(chunk)

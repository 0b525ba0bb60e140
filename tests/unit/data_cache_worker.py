"""One process that prepares (or finds ready) a data cache entry, for tests/unit/test_data_cache.py.

    python tests/unit/data_cache_worker.py CACHE_DIR DATA_FILE [GO_FILE]

Waits for GO_FILE to exist (so several start at once), then prints one JSON line: built, host, and a digest of the
data it loaded. ZK_TEST_HOST: the host name this process has (another "node" on the same filesystem).
ZK_TEST_HANG: print "hanging" once the first encoded batch is written and sleep (a preparer to kill -9 mid-build)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from zero_kit.data import pipeline
from zero_kit.data.cache import DataSpec, prepared
from zero_kit.data.dataset import load_dataset_rows
from zero_kit.model import ASSET_TOKENIZER, load_tokenizer


def spec(data: str) -> DataSpec:
    return DataSpec((data,), "alpaca", 64, pack=False, skip_bad=False, tokenizer_dir=str(ASSET_TOKENIZER))


def digest(dataset) -> str:
    return hashlib.sha256(json.dumps(dataset[:], sort_keys=True).encode()).hexdigest()


def _hang_after_first_batch() -> None:
    encode, calls = pipeline._encode_batch, []

    def encode_then_hang(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first batch is written by now
            print("hanging", flush=True)
            time.sleep(600)
        return encode(*args, **kwargs)

    pipeline._encode_batch = encode_then_hang


def main(cache_dir: str, data: str, go: str | None = None) -> None:
    if os.environ.get("ZK_TEST_HOST"):
        host = os.environ["ZK_TEST_HOST"]
        socket.gethostname = lambda: host
    if os.environ.get("ZK_TEST_HANG"):
        _hang_after_first_batch()
    while go and not Path(go).exists():
        time.sleep(0.01)
    entry = prepared(spec(data), Path(cache_dir), lambda: load_dataset_rows([data], "alpaca"), load_tokenizer)
    train, _, stats = entry.load()
    print(json.dumps({"built": entry.built, "host": socket.gethostname(), "digest": digest(train)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

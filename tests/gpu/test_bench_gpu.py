"""The benchmark harness on CUDA: NCCL, bf16, SDPA, CUDA memory and MFU fields. Skipped cleanly without CUDA."""

from __future__ import annotations

import pytest
import torch

from zero_kit.bench import BenchOptions, run_bench

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_bf16_ddp_and_zero3_on_one_gpu_record_cuda_memory_and_mfu(tmp_path):
    opts = BenchOptions(strategies="ddp,zero3", nproc=1, precision="bf16", steps=6, warmup=2, seq_len=256,
                        out=str(tmp_path), master_port=29760, timeout=300)  # fmt: skip
    records = run_bench(opts)
    for r in records:
        assert not r.get("failed"), r.get("log_tail")
        assert r["device"] == "cuda" and r["precision"] == "bf16"
        assert r["peak_mem_bytes"]["cuda_allocated"] > 0 and r["peak_mem_bytes"]["cuda_reserved"] > 0
        assert r["mfu"] is None or 0 < r["mfu"] < 1
        assert r["hardware"]["gpu"]

"""`zero-kit bench`: DDP vs FSDP2 vs ZeRO with real launches (driver), one rank per process (worker), records
and the report (JSONL, markdown table, PNG plots)."""

from zero_kit.bench.driver import run_bench
from zero_kit.bench.options import BenchOptions

__all__ = ["BenchOptions", "run_bench"]

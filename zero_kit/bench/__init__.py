"""`zero-kit bench`: DDP vs FSDP2 vs ZeRO with real launches (driver), one rank per process (worker), records
and the report (JSONL, markdown table, PNG plots)."""

from zero_kit.bench.options import BenchOptions

__all__ = ["BenchOptions", "run_bench"]


def __getattr__(name: str):
    """`run_bench` on first use: the driver's modules (launch, plan) stay out of `zero-kit --help` and of every
    import of the options alone."""
    if name == "run_bench":
        from zero_kit.bench.driver import run_bench

        return run_bench
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

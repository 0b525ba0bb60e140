"""An out-of-memory in a rank, named (issue 40): caught at the top of the rank's training, said in one line with
the step, the planner's peak beside the measured one and the cheapest fix, instead of PyTorch's traceback from
inside DeepSpeed, which names neither the micro batch, the sequence length nor the stage that caused it.

    with out_of_memory_named(planned_bytes, fix, lambda: trainer.state.global_step):
        trainer.train()

Exit code 1 (a rank failed), not 2: the flags were accepted, the machine ran short.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from zero_kit.errors import UserError
from zero_kit.metrics import GIB

EXIT_OUT_OF_MEMORY = 1


CPU_OUT_OF_MEMORY = "DefaultCPUAllocator: can't allocate memory"
"""torch's RuntimeError when the host refuses an allocation (an RLIMIT_AS cap, strict overcommit)."""


def is_out_of_memory(err: BaseException) -> bool:
    """torch.OutOfMemoryError (torch.cuda.OutOfMemoryError), Python's MemoryError, torch's CPU allocator refusing,
    or an error that carries their text onwards (DeepSpeed and the Trainer re-raise some as RuntimeError),
    anywhere in the chain."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err)
        if type(err).__name__ in ("OutOfMemoryError", "MemoryError") or "CUDA out of memory" in text:
            return True
        if CPU_OUT_OF_MEMORY in text:
            return True
        err = err.__cause__ or err.__context__
    return False


def measured_peak() -> tuple[int, str]:
    """This process's peak so far: the CUDA caching allocator's reserved bytes on a GPU, else the peak RSS."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_reserved(), "reserved on the GPU"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS"  # Linux: KiB


def out_of_memory_error(step: int | None, planned: int | None, fix: str) -> UserError:
    measured, what = measured_peak()
    plan = f"planned peak {planned / GIB:.2f} GiB" if planned else "no plan"
    at = f"at step {step}" if step is not None else "before the first step"
    return UserError(
        f"out of memory {at}: {plan}, measured peak {measured / GIB:.2f} GiB ({what})",
        fix,
        exit_code=EXIT_OUT_OF_MEMORY,
    )


@contextmanager
def out_of_memory_named(planned: int | None, fix: str, step: Callable[[], int | None]) -> Iterator[None]:
    """An out-of-memory inside the block becomes a UserError (one line, no traceback, exit 1); anything else
    passes unchanged. `step`: the optimizer step reached, asked only when it happens."""
    try:
        yield
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        try:
            reached = step()
        except Exception:  # the Trainer's state may not exist yet
            reached = None
        raise out_of_memory_error(reached, planned, fix) from None

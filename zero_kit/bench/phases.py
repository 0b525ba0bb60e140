"""A bench step split into phases (forward, backward, reduction, optimizer step, gather, all-to-all, other), measured the same
way for every strategy: the worker marks its windows, the CommCounter (zero_kit.metrics) says how long collectives
held the rank inside each. docs/comparing.md describes the phases and what overlap means for them."""

from __future__ import annotations

import time
from typing import Any

from zero_kit.metrics import COMM_PHASES, CommCounter

PHASES = ("forward", "backward", "reduction", "step", "gather", "alltoall", "other")
"""A step's phases, in the bench's record and table; they add up to the step time."""
WINDOWS = ("forward", "backward", "forward_backward", "step")
"""The spans the bench marks in a step: forward, backward and the optimizer step, or, where one call runs both
(a pipeline schedule), forward_backward in place of the first two."""


class PhaseClock:
    """Splits a step into PHASES. After `begin()` the caller marks the end of each window (WINDOWS) of the step;
    `synchronize` (torch.cuda.synchronize on CUDA, nothing on CPU) runs before each clock read, so a window holds
    the device work it queued. With the CommCounter's exposed seconds (module doc) read at each mark:

        forward, backward, step = the window's wall seconds minus the collective seconds inside it
        reduction, gather,      = the step's exposed collective seconds of that kind, wherever they fell
        alltoall                  (alltoall: Ulysses' head exchange, inside forward and backward)
        other                   = step seconds minus all of the above: what lies between the windows (the batch
                                  moved to the device, the loop itself); >= 0 up to clock jitter

    so the phases add up to the step. A forward_backward window (a pipeline schedule) is reported as forward, and
    backward is None. `end(step_seconds)` returns the split in seconds and the raw windows beside it (wall seconds
    and the collective seconds of each kind inside each window: where the communication happened)."""

    def __init__(self, counter: CommCounter, synchronize=None) -> None:
        self.counter = counter
        self._sync = synchronize or (lambda: None)
        self._last = 0.0
        self._begin: dict[str, float] = {}
        self._comm: dict[str, float] = {}
        self._windows: dict[str, dict[str, float]] = {}

    def begin(self) -> None:
        self._sync()
        self._windows = {}
        self._begin = self._comm = dict(self.counter.seconds)
        self._last = time.perf_counter()

    def mark(self, window: str) -> None:
        """End the running window (a name from WINDOWS; repeated windows add up); the next one starts now."""
        self._sync()
        now = time.perf_counter()
        comm = dict(self.counter.seconds)
        entry = self._windows.setdefault(window, {"wall": 0.0, **dict.fromkeys(COMM_PHASES, 0.0)})
        entry["wall"] += now - self._last
        for phase in COMM_PHASES:
            entry[phase] += comm[phase] - self._comm[phase]
        self._comm, self._last = comm, now

    def end(self, step_seconds: float) -> dict[str, Any]:
        """The step's {"phases": PHASES in seconds, "windows": ...}; call it right after the step's timer stops."""
        phases: dict[str, Any] = dict.fromkeys(PHASES, 0.0)
        for window, entry in self._windows.items():
            name = "forward" if window == "forward_backward" else window
            phases[name] += entry["wall"] - sum(entry[phase] for phase in COMM_PHASES)
        if "forward_backward" in self._windows:
            phases["backward"] = None
        for phase in COMM_PHASES:
            phases[phase] = self.counter.seconds[phase] - self._begin[phase]
        phases["other"] = step_seconds - sum(v for k, v in phases.items() if k != "other" and v is not None)
        return {"phases": phases, "windows": {k: dict(v) for k, v in self._windows.items()}}

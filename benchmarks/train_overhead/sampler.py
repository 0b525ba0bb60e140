"""CPU of each process of a run, sampled from outside while it runs (psutil, every SAMPLE_S): how much of a core
the ranks got and how much the run's other processes took (zero-kit's relaunching parent and its supervisor, the
guardians of the stall watchdog, the deepspeed launchers) over the steps' wall-clock window. On a host with as
many cores as ranks, every other busy process takes its share from the ranks."""

from __future__ import annotations

import time

import psutil

SAMPLE_S = 0.2


def kind(argv: list[str], module: str) -> str:
    """What a process of the run is, from its command line."""
    words = " ".join(argv)
    if "zero_kit.watchdog" in words:
        return "guardian"
    if "deepspeed.launcher" in words:
        return "launcher"
    if module in argv and "--nproc" in argv:
        return "parent"  # `zero-kit train --nproc 2` itself: it relaunches and supervises
    return "rank" if module in argv else "other"


class CpuSampler:
    """CPU seconds of every process under `root`, as (wall, cpu) series per pid."""

    def __init__(self, root: int, module: str):
        self.root, self.module = root, module
        self.kinds: dict[int, str] = {}
        self.series: dict[int, list[tuple[float, float]]] = {}

    def sample(self) -> None:
        try:
            top = psutil.Process(self.root)
            procs = [top, *top.children(recursive=True)]
        except psutil.Error:
            return
        now = time.time()
        for proc in procs:
            try:
                if self.kinds.get(proc.pid, "other") == "other":  # a process just forked shows its parent's argv
                    self.kinds[proc.pid] = kind(proc.cmdline(), self.module)
                times = proc.cpu_times()
            except psutil.Error:
                continue
            self.series.setdefault(proc.pid, []).append((now, times.user + times.system))

    def shares(self, start: float, end: float) -> dict[str, float]:
        """Per kind: CPU seconds in [start, end] (epoch seconds) over its length, in % of one core (ranks: the
        mean per rank)."""
        used: dict[str, float] = {}
        count: dict[str, int] = {}
        for pid, points in self.series.items():
            seconds = _at(points, end) - _at(points, start)
            used[self.kinds[pid]] = used.get(self.kinds[pid], 0.0) + seconds
            count[self.kinds[pid]] = count.get(self.kinds[pid], 0) + 1
        span = max(end - start, 1e-9)
        shares = {k: round(100 * v / span, 2) for k, v in used.items()}
        if "rank" in shares:
            shares["rank"] = round(shares["rank"] / count["rank"], 1)
        return shares


def _at(points: list[tuple[float, float]], when: float) -> float:
    """CPU seconds at `when`, linear between samples (the first or last sample outside them)."""
    if when <= points[0][0]:
        return points[0][1]
    for (t0, c0), (t1, c1) in zip(points, points[1:], strict=False):
        if t0 <= when <= t1:
            return c0 + (c1 - c0) * (when - t0) / max(t1 - t0, 1e-9)
    return points[-1][1]

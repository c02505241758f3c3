"""Where a run's steps spend the device's time: busy inside a step, or idle between two.

Why: a step timed from the host (``T(long) - T(short)``) cannot tell a slower kernel
sequence from a device waiting for the host.  CUDA events recorded on the stream
around each ``run_loop.step`` call say both: ``span`` is the device time from a step's
first queued work to its last (idle gaps inside the step included), ``gap`` the device
time between one step's end and the next one's start (the host still deciding or
launching).  A captured graph's replay that waits for the previous replay's skin
measure shows as gaps; slower replayed kernels show as longer spans.  Off CUDA the
same figures come from the host's clock (a smoke run: they mean nothing).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from typing import Any

import torch
from common import median

import alchemi_lit.engine.run_loop as run_loop


class _Mark:
    """One point on the device's timeline (a CUDA event, or the host clock off CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        if self.event is not None:
            self.event.record()
        self.host = time.perf_counter()

    def ms_to(self, later: _Mark) -> float:
        if self.event is not None:
            return self.event.elapsed_time(later.event)
        return (later.host - self.host) * 1e3


class TimedStep:
    """Wraps a run loop's step function (eager or :class:`GraphedSteps`), marking the
    device's timeline before and after each call; every other attribute is the
    wrapped one's (the bench reads GraphedSteps' counters through it)."""

    def __init__(self, inner: Any, device: torch.device, marks: list) -> None:
        self.inner, self.device, self.marks = inner, device, marks

    def __call__(self, batch: Any, ctx: Any) -> None:
        start = _Mark(self.device)
        self.inner(batch, ctx)
        self.marks.append((start, _Mark(self.device)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextlib.contextmanager
def step_marks(device: torch.device) -> Iterator[list]:
    """Every run started inside the block marks its steps into the yielded list."""
    marks: list = []
    original = run_loop.step_function

    def timed_step_function(loop: Any, simulator: Any) -> TimedStep:
        return TimedStep(original(loop, simulator), device, marks)

    run_loop.step_function = timed_step_function
    try:
        yield marks
    finally:
        run_loop.step_function = original


def timeline(marks: list, device: torch.device, skip: int = 5) -> dict[str, float]:
    """Median ``span_ms`` (a step's device time, start to end) and ``gap_ms`` (idle
    before the next step starts) over the steps after the first ``skip``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    steady = marks[skip:] if len(marks) > skip + 2 else marks
    spans = [a.ms_to(b) for a, b in steady]
    gaps = [b.ms_to(a2) for (_, b), (a2, _) in itertools.pairwise(steady)]
    return {"span_ms": median(spans), "gap_ms": median(gaps) if gaps else 0.0,
            "steps": len(steady)}  # fmt: skip

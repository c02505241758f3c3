"""How bench_gpu.py measures a step on any device: time, syncs, reads, ops, memory.

Why differencing: a run's wall time holds its setup (the batch to the device, the
first neighbour list, the results back to the host), which says nothing about a
step.  ``T(long) - T(short)`` over the steps between them is the steady step as a
user's run pays it, every few steps' rebuilds and bookkeeping included, for any
engine (no hook inside TorchSim is needed) and whatever the launch queue does in
between: both ends are device-synchronised.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from common import median

from alchemi_lit.engine.hooks import Callback, StepContext


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Seconds of ``fn()`` with the device idle at both ends, and what it returned."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out


@dataclass
class StepTiming:
    """Seconds per steady step of each repeat (``T(long) - T(short)`` over the steps
    between), and the step counts used."""

    per_step: list[float]
    short: int
    long: int
    capped: str = ""  # why fewer repeats than asked; "~ ..." where it is an estimate

    @property
    def median(self) -> float:
        return median(self.per_step)


def step_time(
    run: Callable[[int], Any],
    device: torch.device,
    short: int,
    repeats: int,
    target_s: float,
    max_steps: int = 200,
    budget_s: float | None = None,
) -> StepTiming:
    """Time ``run(n)`` (a whole run of ``n`` steps) at ``short`` and at a longer ``n``.

    A first ``run(short)`` warms up (imports, kernels, allocator); then runs of
    ``short`` and ``3 short`` steps estimate a step without the run's set-up (for a
    budgeted peer, the warm-up alone estimates it from above: a run of ``n`` steps
    calls the model ``n + 1`` times), and the long run adds enough steps for
    ``target_s`` seconds (at least 3, at most ``max_steps``).  Why not the warm-up
    alone: where set-up dwarfs a step (8,192 systems on a GPU), it made the long run
    add a few steps only, and the set-up's noise swamped them.
    With ``budget_s`` (a slow peer), repeats stop once the next would pass it, and a
    single pass that would is not made: ``per_step`` then holds the warm-up's
    estimate alone and ``capped`` says so.
    """
    t_warm, _ = timed(lambda: run(short), device)
    estimate = t_warm / (short + 1)
    if budget_s is None:  # (the first run of a process pays CUDA's start: not from it)
        t_short, _ = timed(lambda: run(short), device)
        t_more, _ = timed(lambda: run(3 * short), device)
        estimate = max((t_more - t_short) / (2 * short), 1e-6)
    extra = int(min(max(3, round(target_s / max(estimate, 1e-9))), max_steps))
    one_pass = estimate * (2 * short + 2 + extra)
    if budget_s is not None and one_pass > budget_s:
        return StepTiming([estimate], short, short, f"~ from one run (a pass > {budget_s:.0f} s)")
    per_step, longs, spent, capped = [], [], t_warm, ""
    for k in range(repeats):
        if budget_s is not None and k > 0 and spent + one_pass > budget_s:
            capped = f"{k} of {repeats} repeats (budget)"
            break
        t_short, _ = timed(lambda: run(short), device)
        t_long, _ = timed(lambda: run(short + extra), device)
        spent += t_short + t_long
        per_step.append(max(t_long - t_short, 0.0) / extra)
        longs.append(t_long / (short + extra + 1))
    if median(per_step) <= 0.0:  # the steps drowned in the runs' noise (a busy CPU)
        return StepTiming(longs, short, short + extra, "~ noise: the long runs' mean per call")
    return StepTiming(per_step, short, short + extra, capped)


def call_time(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn()`` after one untimed call (the bare model call)."""
    fn()
    return median([timed(fn, device)[0] for _ in range(max(repeats, 3))])


def repeat_runs(
    fn: Callable[[], dict[str, Any]], device: torch.device, repeats: int, budget_s: float | None
) -> tuple[list[float], dict[str, Any], float | None]:
    """Wall times of whole runs (the caller warmed up), ``repeats`` of them or, with
    ``budget_s``, as many as fit (at least one); the last run's output; peak MiB."""
    walls: list[float] = []
    out: dict[str, Any] = {}
    with peak_memory(device) as mem:
        while len(walls) < repeats and (
            budget_s is None or not walls or sum(walls) + walls[-1] <= budget_s
        ):
            wall, out = timed(fn, device)
            walls.append(wall)
    return walls, out, mem["MiB"]


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[dict[str, float | None]]:
    """``{"MiB": ...}`` filled on exit with ``torch.cuda.max_memory_allocated`` over the
    block (None off CUDA: the CPU's resident size says little about one workload)."""
    out: dict[str, float | None] = {"MiB": None}
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        yield out
    finally:
        if device.type == "cuda":
            synchronize(device)
            out["MiB"] = torch.cuda.max_memory_allocated(device) / 2**20


# --------------------------------------------------------------------------- CUDA syncs
@dataclass
class SyncCount:
    """Blocking syncs ``torch.cuda.set_sync_debug_mode("warn")`` reported, per step."""

    per_step: list[int] = field(default_factory=list)
    sites: Counter = field(default_factory=Counter)

    def summary(self, skip: int = 2) -> dict[str, Any]:
        """Mean per steady step (the first ``skip`` steps left out), the share of steady
        steps without any, and the five most frequent code sites."""
        steady = self.per_step[skip:] or self.per_step
        return {
            "syncs_per_step": sum(steady) / max(len(steady), 1),
            "steps_without_sync": sum(1 for n in steady if n == 0) / max(len(steady), 1),
            "sync_sites": self.sites.most_common(5),
        }


@contextlib.contextmanager
def sync_warnings(device: torch.device) -> Iterator[list[warnings.WarningMessage]]:
    """Record every blocking sync on ``device`` as a warning (nothing off CUDA)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)


def is_sync(w: warnings.WarningMessage) -> bool:
    return "synchroniz" in str(w.message)


def site(w: warnings.WarningMessage) -> str:
    return f"{os.path.relpath(w.filename)}:{w.lineno}"


class SyncTally(Callback):
    """Counts the sync warnings recorded in ``caught`` between a step's start and end
    (a callback of the counted run only: timed runs have none)."""

    def __init__(self, caught: list[warnings.WarningMessage], count: SyncCount) -> None:
        super().__init__()
        self.caught, self.count, self._start = caught, count, 0

    def before_step(self, ctx: StepContext) -> None:
        self._start = len(self.caught)

    def after_step(self, ctx: StepContext) -> None:
        new = [w for w in self.caught[self._start :] if is_sync(w)]
        self.count.per_step.append(len(new))
        self.count.sites.update(site(w) for w in new)


def syncs_by_difference(
    run: Callable[[int], Any], device: torch.device, short: int, long: int
) -> dict[str, Any]:
    """Syncs per step of an engine without hooks (TorchSim): those of ``run(long)``
    less those of ``run(short)``, over the steps between."""
    counts, sites = [], Counter()
    for n in (short, long):
        with sync_warnings(device) as caught:
            run(n)
        found = [w for w in caught if is_sync(w)]
        counts.append(len(found))
        sites.update(site(w) for w in found)
    return {
        "syncs_per_step": (counts[1] - counts[0]) / max(long - short, 1),
        "steps_without_sync": None,
        "sync_sites": sites.most_common(5),
    }


# --------------------------------------------------------------------------- StepProbe
def probe_tools() -> tuple[Any, Any] | None:
    """``(StepProbe, accelerator_path)`` from alchemi_lit.testing, None where this
    alchemi_lit predates them."""
    try:
        from alchemi_lit.testing import StepProbe, accelerator_path
    except ImportError:
        return None
    return StepProbe, accelerator_path


def probe_summary(probe: Any, skip: int = 2) -> dict[str, Any]:
    """Host reads and aten ops per steady step from a finished StepProbe."""
    here = os.getcwd() + os.sep
    reads = probe.reads_per_step[skip:] or probe.reads_per_step
    ops = probe.ops_per_step[skip:] or probe.ops_per_step
    return {
        "reads_per_step": sum(reads) / max(len(reads), 1),
        "steps_without_read": sum(1 for r in reads if r == 0) / max(len(reads), 1),
        "ops_per_step": median(ops) if ops else None,
        "ops_max": max(ops) if ops else None,
        "read_sites": list(dict.fromkeys(w.replace(here, "") for w in probe.where))[:5],
    }

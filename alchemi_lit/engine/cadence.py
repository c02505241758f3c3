"""When the run loop does its host bookkeeping: every N steps, or as soon as it pays.

Bookkeeping (graduating finished systems, refilling, ON_CONVERGE) needs the host to
read per-system flags, and reading a device tensor blocks until the device is done.
Doing it every step costs that sync every step; doing it every N steps keeps finished
systems in the forward for up to N - 1 steps, and in a relaxation, where systems finish
one by one, a good part of the atom evaluations is then spent on frozen atoms
(docs/design/29-bookkeeping-when-it-pays.md).

``sync_every="auto"`` does neither.  After every step the few numbers bookkeeping
needs -- how many systems and atoms are finished, whether any left a stage -- are
copied to the host *without waiting* (a pinned buffer and an event on a GPU) and read
one step later, when the copy is long complete.  They are recomputed only when the
status tensor changed (a few steps in thousands), so a plain step costs nothing.  The
loop then books when the forward time the finished atoms waste by staying (their share
of a step's measured time, summed over the steps they stay) reaches the measured cost
of a bookkeeping: at once with an expensive model, in bunches with a cheap one, and
at once whenever every system in the batch is finished (no later step could gain
anything; a run of single points thus takes as many forwards whatever the timings).  A
system finished at step ``t`` is thus out of the forward by step ``t + 2`` whenever a
bookkeeping is cheaper than a forward of it.  Where reading the flags costs no wait
(tensors on the CPU) the view is the step's own, and the system is out by ``t + 1``:
exactly the atoms needed go through the model.  An integer keeps the fixed cadence.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import torch

from ..core.errors import ConfigError
from ..core.tensor_ops import host_reads_free, identity_key, same_key

SyncEvery = int | Literal["auto"]
#: with "auto", book at least this often (checkpoint schedules, the safety net)
MAX_AUTO_INTERVAL = 100
_SMOOTHING = 0.2  # weight of a new timing in the running means


def check_sync_every(value: Any) -> SyncEvery:
    """``"auto"`` or an integer >= 1; anything else is a ConfigError naming the choice."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        ok = not isinstance(value, bool) and int(value) == value and int(value) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(
            f"sync_every must be 'auto' (book as soon as it pays) or an integer >= 1 (steps "
            f"between bookkeepings), got {value!r}"
        )
    return int(value)


class FinishWatch:
    """The one-step-late view of what bookkeeping would find (the step's own where host
    reads are free; see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._key: list[Any] | None = None
        self._pending: tuple[torch.Tensor, Any] | None = None  # (host flags, event)
        self.view = (0, 0, 0)  # finished systems, finished atoms, exited (previous step)
        self._latest = (0, 0, 0)

    def reset(self) -> None:
        """After a bookkeeping: the batch changed, nothing is known to be finished."""
        self._key, self._pending = None, None
        self.view = self._latest = (0, 0, 0)

    def after_step(self, batch: Any, exit_code: int, exited: torch.Tensor | None) -> None:
        """Note this step's flags (computed only when the status tensor changed) and make
        the previous step's the view."""
        status = batch.status
        key = identity_key((status, exited))
        self.view = self._latest if self._pending is None else self._read()
        if self._key is not None and same_key(self._key, key):
            return
        self._key = key
        finished = status == exit_code
        flags = torch.stack(
            [
                finished.sum(),
                (batch.n_atoms * finished).sum(),
                exited.sum() if exited is not None else finished.sum() * 0,
            ]
        )
        if host_reads_free(flags):  # (CPU: no copy to wait for, so no lag either)
            self._pending, self._latest = None, tuple(flags.tolist())
            self.view = self._latest
            return
        cuda = flags.device.type == "cuda"
        host = torch.empty(3, dtype=flags.dtype, pin_memory=cuda)
        host.host_buffer = True  # (a host copy: reading it never waits on the device)
        host.copy_(flags, non_blocking=cuda)
        event = torch.cuda.Event() if cuda else None
        if event is not None:
            event.record()
        self._pending = (host, event)

    def _read(self) -> tuple[int, int, int]:
        host, event = self._pending
        if event is not None:
            event.synchronize()  # (recorded a step ago: complete, or nearly)
        self._pending = None
        self._latest = tuple(host.tolist())
        return self._latest


class Cadence:
    """Decides after each step whether to book now (fixed every N, or auto)."""

    def __init__(self, sync_every: SyncEvery, device: torch.device, on_converge: bool) -> None:
        self.fixed = None if sync_every == "auto" else int(sync_every)
        self.watch = FinishWatch(device)
        self.on_converge = on_converge  # callbacks want ON_CONVERGE soon after an exit
        self.step_s: float | None = None  # running mean of a step's wall time
        self.book_s: float | None = None  # running mean of a bookkeeping's wall time
        self.waste_s = 0.0
        self._since = 0
        self._t = time.perf_counter()

    @property
    def auto(self) -> bool:
        return self.fixed is None

    def steps_left(self, step: int) -> int:
        """How many steps may run before the next bookkeeping at most."""
        if self.fixed is not None:
            return self.fixed - step % self.fixed
        return MAX_AUTO_INTERVAL - self._since

    def after_step(self, batch: Any, exit_code: int, exited: torch.Tensor | None) -> bool:
        """Account for the step just taken; True when a bookkeeping is due now."""
        now = time.perf_counter()
        self.step_s = _mean(self.step_s, now - self._t)
        self._t = now
        self._since += 1
        if self.fixed is not None:
            return False  # (the caller counts the fixed steps)
        self.watch.after_step(batch, exit_code, exited)
        finished, atoms, left_stage = self.watch.view
        if left_stage and self.on_converge:
            return True
        if not finished:
            return False
        if atoms >= batch.num_atoms:  # nothing left to finish: a further step is all waste
            return True
        self.waste_s += self.step_s * atoms / max(batch.num_atoms, 1)
        return self.book_s is None or self.waste_s >= self.book_s

    def booked(self, seconds: float) -> None:
        """A bookkeeping took ``seconds``: start over."""
        self.book_s = _mean(self.book_s, seconds)
        self.waste_s, self._since = 0.0, 0
        self.watch.reset()
        self._t = time.perf_counter()


def _mean(old: float | None, new: float) -> float:
    return new if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * new

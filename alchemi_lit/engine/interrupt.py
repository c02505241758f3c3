"""SIGTERM and SIGINT end a run cleanly, with or without a Checkpoint callback.

A scheduler's time limit (SLURM sends SIGTERM, then SIGKILL after a grace period),
``scancel`` or Ctrl-C must never cost finished results.  Left to the default
handlers, SIGTERM kills the process on the spot (buffered sink writes are lost) and
SIGINT raises ``KeyboardInterrupt`` anywhere, even halfway through a sink write.  So
every run loop installs :class:`InterruptGuard`: the handler only notes the signal;
the loop stops after the current step, graduates what has finished, flushes every
sink, writes a checkpoint when a Checkpoint callback is there, and raises
:class:`RunInterrupted`, whose message says where the results are and how to go on.
A second SIGINT (Ctrl-C pressed again) interrupts at once, as users expect.  While a
guard is installed a :class:`~.memory_watch.MemoryWatch` sends the same SIGTERM when free
memory runs out, before the kernel's out-of-memory killer would (a SIGKILL, which no
handler sees).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from loguru import logger

from .memory_watch import MemoryWatch

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on SIGTERM/SIGINT after saving what it had.

    ``signum``: the signal; ``path``: the checkpoint written (None without a
    Checkpoint callback); ``results``: the :class:`~alchemi_lit.io.results.Results` of the
    systems finished before the signal (None where a rank process cannot return them);
    ``where``: a sentence saying where those results were written.
    """

    def __init__(
        self, path: Any, signum: int, where: str = "", results: Any = None, resumable: bool = True
    ) -> None:
        name = signal.Signals(signum).name if signum in iter(signal.Signals) else str(signum)
        text = f"interrupted by {name}"
        if where:
            text += f"; {where}"
        if path is not None:
            text += f"; checkpoint written to {path}"
        super().__init__(text)
        self.path, self.signum, self.where, self.results = path, signum, where, results
        self.resumable = resumable

    def __reduce__(self) -> tuple[Any, ...]:  # picklable: raised in rank processes
        return (type(self), (self.path, self.signum, self.where, None, self.resumable))


class InterruptGuard:
    """Notes SIGTERM/SIGINT while a run loop is inside it (see the module docstring).

    Installed only in the main thread (Python delivers signals there); elsewhere it
    does nothing and ``received`` stays None.  Nested guards share the outer one's
    handlers, so a strategy and the loop it runs can both hold one.
    """

    _active: InterruptGuard | None = None

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._watch: MemoryWatch | None = None

    def __enter__(self) -> InterruptGuard:
        outer = InterruptGuard._active
        if outer is not None:
            return outer
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._note)
            InterruptGuard._active = self
            self._watch = MemoryWatch().start()  # (a SIGTERM before the OOM killer's SIGKILL)
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop now
        self.received = signum
        logger.warning(
            f"{signal.Signals(signum).name} received: stopping after this step, saving every "
            f"finished system first (Ctrl-C again to stop at once)"
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if InterruptGuard._active is not self:
            return
        if self._watch is not None:  # (before the handlers go: its signal must find ours)
            self._watch.stop()
            self._watch = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        InterruptGuard._active = None


def current_signal() -> int | None:
    """The signal the active guard noted, if any (None outside a guarded run)."""
    guard = InterruptGuard._active
    return None if guard is None else guard.received

"""Stop a run cleanly before the kernel's out-of-memory killer stops it.

Why: an out-of-memory kill is a SIGKILL -- no handler runs, so the systems a sink still
buffers are lost with the ones in flight, and the user sees a process that vanished
with no message.  A run's memory grows in steps (a refill, a neighbour-list rebuild), so
a thread that reads the free memory a few times a second sees the room shrink before it
is gone.  When it falls under a floor the watch logs what happened and how to avoid it,
and sends this process a SIGTERM: the run loop's :class:`~.interrupt.InterruptGuard`
then stops after the step, graduates what has finished, flushes every sink and writes
a checkpoint if it has one -- exactly as for a scheduler's SIGTERM.

The floor: ``ALCHEMI_LIT_MEMORY_FLOOR_MB`` (0 turns the watch off), else 3 % of the
memory the process may use, at least 256 MiB.  Free memory is what
:class:`~alchemi_lit.data.memory.ProcessMemoryReader` reads: ``MemAvailable``, or less
under a container's limit.
"""

from __future__ import annotations

import os
import signal
import threading

from loguru import logger

from ..data.memory import host_memory_room, host_memory_total

ENV_FLOOR = "ALCHEMI_LIT_MEMORY_FLOOR_MB"
#: seconds between two reads of the free memory
INTERVAL = 0.2


def memory_floor() -> int:
    """Bytes of free memory under which a run stops (module docstring)."""
    value = os.environ.get(ENV_FLOOR, "").strip()
    if value:
        try:
            return max(int(float(value) * 2**20), 0)
        except ValueError:
            logger.warning(f"{ENV_FLOOR}={value!r} is not a number of MiB; using the default")
    return max(int(0.03 * host_memory_total()), 256 * 2**20)


class MemoryWatch:
    """A daemon thread that sends SIGTERM to this process when free memory runs low."""

    def __init__(self, floor: int | None = None, interval: float = INTERVAL) -> None:
        self.floor = memory_floor() if floor is None else int(floor)
        self.interval = interval
        self.fired = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # (a kill and a stop never cross)
        self._thread: threading.Thread | None = None

    def start(self) -> MemoryWatch:
        if self.floor > 0:
            self._thread = threading.Thread(target=self._watch, name="memory-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; once this returns no signal will be sent."""
        with self._lock:
            self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                room = host_memory_room()
            except OSError:  # no /proc: nothing to watch
                return
            if room >= self.floor:
                continue
            with self._lock:
                if self._stop.is_set():
                    return
                self.fired = True
                logger.error(
                    f"free memory is down to {room / 2**20:.0f} MiB (floor "
                    f"{self.floor / 2**20:.0f} MiB): stopping the run as on SIGTERM so that "
                    f"finished systems are kept. Give the sampler a smaller budget "
                    f"(max_atoms, or max_atoms='auto' with a lower memory_fraction), or set "
                    f"{ENV_FLOOR} (0 turns this watch off)"
                )
                os.kill(os.getpid(), signal.SIGTERM)
            return


__all__ = ["ENV_FLOOR", "MemoryWatch", "memory_floor"]

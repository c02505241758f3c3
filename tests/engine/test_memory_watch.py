"""A run whose free memory runs out stops as on SIGTERM, keeping every finished system
(issue #46, part 2): the kernel's out-of-memory killer would SIGKILL it, losing what the
sinks buffer, with no message."""

from __future__ import annotations

import signal
import time

import pytest
from test_interrupt import _run, interrupt_script

from alchemi_lit.engine import memory_watch
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.engine.interrupt import RunInterrupted, current_signal
from alchemi_lit.engine.memory_watch import ENV_FLOOR, MemoryWatch, memory_floor
from alchemi_lit.sinks import ZarrSink


class MemoryRunsOut(Callback):
    """Once ``after`` systems finished, the free memory reads as nothing; then waits
    (at most 5 s) for the watch's signal, as a step that keeps allocating would."""

    def __init__(self, room: list[int], after: int) -> None:
        super().__init__()
        self.room, self.after, self.finished, self.done = room, after, 0, False

    def on_converge(self, ctx) -> None:
        self.finished += int((ctx.batch.status == ctx.state["exit_code"]).sum())

    def after_step(self, ctx) -> None:
        if self.finished >= self.after and not self.done:
            self.done, self.room[0] = True, 0
            deadline = time.monotonic() + 5.0
            while current_signal() is None and time.monotonic() < deadline:
                time.sleep(0.02)


def test_low_memory_stops_the_run_keeping_finished_systems_and_it_resumes(
    tmp_path, monkeypatch, log_messages
):
    room = [1 << 40]
    monkeypatch.setattr(memory_watch, "host_memory_room", lambda: room[0])
    handler_before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunInterrupted) as caught:
        _run(tmp_path, MemoryRunsOut(room, interrupt_script.READY_AFTER))
    assert caught.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is handler_before
    said = " ".join(text for level, text in log_messages if level == "ERROR")
    assert "free memory is down to 0 MiB" in said and "max_atoms" in said and ENV_FLOOR in said
    saved = ZarrSink(tmp_path / "results.zarr").read_batch()
    assert interrupt_script.READY_AFTER <= saved.num_systems < len(interrupt_script.data())
    room[0] = 1 << 40
    _run(tmp_path, resume=True)
    assert ZarrSink(tmp_path / "results.zarr").read_batch().num_systems == len(
        interrupt_script.data()
    )


def test_a_stopped_watch_sends_nothing_and_the_floor_follows_the_setting(monkeypatch):
    monkeypatch.setattr(memory_watch, "host_memory_room", lambda: 0)
    sent = []
    monkeypatch.setattr(memory_watch.os, "kill", lambda pid, sig: sent.append(sig))
    watch = MemoryWatch(floor=1, interval=0.01).start()
    watch.stop()
    time.sleep(0.05)
    assert sent == [] or sent == [signal.SIGTERM]  # (it may have fired before the stop)
    assert watch.fired == bool(sent)
    quiet = MemoryWatch(floor=0).start()  # a floor of 0 watches nothing
    assert quiet._thread is None
    monkeypatch.setenv(ENV_FLOOR, "512")
    assert memory_floor() == 512 * 2**20
    monkeypatch.setenv(ENV_FLOOR, "0")
    assert memory_floor() == 0
    monkeypatch.delenv(ENV_FLOOR)
    assert memory_floor() >= 256 * 2**20

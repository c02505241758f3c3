"""SIGTERM/SIGINT inside a run, in this process: the run loop's side of issue #16 part 1.

The signal is sent by a callback to its own process once a few systems have finished,
so the handler, the stop after the step, the flush of a buffering ZarrSink without a
Checkpoint and the resume from the store are all exercised in well under a second of
run time.  ``test_signals.py`` (marked slow) does the same with real processes, a
pipeline and the CLI.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.engine.interrupt import RunInterrupted
from alchemi_lit.sinks import ZarrSink

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import interrupt_script


class SignalSelf(Callback):
    """Sends ``sig`` to this process once ``after`` systems have finished."""

    def __init__(self, sig: int, after: int) -> None:
        super().__init__()
        self.sig, self.after, self.finished, self.sent = sig, after, 0, False

    def on_converge(self, ctx) -> None:
        self.finished += int((ctx.batch.status == ctx.state["exit_code"]).sum())

    def after_step(self, ctx) -> None:
        if self.finished >= self.after and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.sig)


def _run(out: Path, callback: Callback | None = None, resume: bool | None = None):
    sim = interrupt_script.simulator(out, pipeline=False, marker=callback)
    return sim.run(SizeAwareSampler(interrupt_script.data(), max_atoms=150), resume=resume)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    _run(out)
    return ZarrSink(out / "results.zarr").read_batch()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_saves_every_finished_system_and_a_resume_completes_the_run(
    tmp_path, reference, sig
):
    handler_before = signal.getsignal(sig)
    with pytest.raises(RunInterrupted) as caught:
        _run(tmp_path, SignalSelf(sig, interrupt_script.READY_AFTER))
    assert signal.getsignal(sig) is handler_before, "the run left its handler installed"
    store = tmp_path / "results.zarr"
    exc = caught.value
    assert exc.signum == sig and str(store) in str(exc) and signal.Signals(sig).name in str(exc)
    saved = ZarrSink(store).read_batch()
    assert saved.num_systems >= interrupt_script.READY_AFTER
    assert saved.num_systems < len(interrupt_script.data())
    assert exc.results is not None and len(exc.results) == saved.num_systems
    ref = reference.select([reference.system_id.tolist().index(s) for s in saved.system_id])
    interrupt_script.assert_same_results(ref, saved)
    _run(tmp_path, resume=True)
    interrupt_script.assert_same_results(reference, ZarrSink(store).read_batch())

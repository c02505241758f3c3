"""ProgressBar tells the truth: atom-steps done of the run's budget, rate and ETA.

The end-to-end tests run a real MD run whose stdout is a pseudo-terminal (the ``pty``
module), as a user's terminal would be, and read what the bar printed: during the MD
stage, while no system has finished yet, the atom-steps advance towards the exact
budget (systems x atoms x steps), with a rate and an ETA.  A bar counting finished
systems stood at 0/N all that time.  The fast one runs in this process with
``sys.stdout`` on the terminal; the slow one in a child process (a few seconds of
imports) whose own stdout is the terminal.
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from alchemi_lit import Simulator
from alchemi_lit.callbacks import ProgressBar
from alchemi_lit.data import SizeAwareSampler, argon_crystals
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STATUS = re.compile(
    r"(?P<done>[\d.]+[kMG]?)/(?P<mark>[~≤]?)(?P<total>[\d.]+[kMG]?) atom-steps \| "
    r"(?P<finished>\d+)/(?P<systems>\d+) systems \| (?P<rate>\S+) atom-steps/s.*?\| "
    r"ETA (?P<eta>\S+)"
)

MD_RUN = """
import alchemi_lit as al
from alchemi_lit.callbacks import ProgressBar
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.models import LennardJones

systems = argon_crystals(n_systems=2, repeat=2, noise=0.05)          # 2 x 32 atoms
sim = al.Simulator(model=LennardJones(0.0104, 3.40, 6.0), stages=VelocityVerlet(dt=1.0, steps=60),
                   callbacks=[ProgressBar(every=3)], accelerator="cpu", sync_every=10)
sim.run(systems)
"""
CHILD = MD_RUN + """
print("CHILD-DONE", flush=True)
input()  # exits once the parent has read everything (a pty loses what is unread at exit)
"""


def si_value(text: str) -> float:
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(text[-1], 1.0)
    return float(text[:-1] if text[-1] in "kMG" else text) * scale


def open_terminal(columns: int) -> tuple[int, int]:
    """A pseudo-terminal (master, slave) of ``columns`` x 50 characters."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    return master, slave


def terminal_env(columns: int) -> dict[str, str]:
    """What a user's terminal sets (rich prefers COLUMNS and LINES to the pty's size)."""
    return {"TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": "50"}


def run_here_on_a_terminal(
    code: str, monkeypatch: pytest.MonkeyPatch, columns: int = 400
) -> str:
    """Run ``code`` in this process with ``sys.stdout`` a pseudo-terminal; its output."""
    import threading

    master, slave = open_terminal(columns)
    monkeypatch.delenv("NO_COLOR", raising=False)
    for name, value in terminal_env(columns).items():
        monkeypatch.setenv(name, value)
    chunks: list[bytes] = []

    def read() -> None:  # drain the terminal as it is written (its buffer is small)
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    terminal, before = os.fdopen(slave, "w", encoding="utf-8"), sys.stdout
    try:
        assert terminal.isatty()
        monkeypatch.setattr(sys, "stdout", terminal)
        exec(compile(code, "<md-run>", "exec"), {})
        terminal.flush()
    finally:
        monkeypatch.setattr(sys, "stdout", before)
        terminal.close()
        reader.join(timeout=30)
        os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


def run_in_pty(code: str, columns: int = 400, timeout: float = 120.0) -> str:
    """Run ``python -c code`` with a pseudo-terminal as stdout and stderr; its output."""
    master, slave = open_terminal(columns)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("NO_COLOR", None)
    env.update(terminal_env(columns))
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
                if b"CHILD-DONE" in b"".join(chunks[-2:]):
                    os.write(master, b"\n")  # everything read: let the child exit
            elif child.poll() is not None:
                break
    finally:
        os.close(master)
        child.wait(timeout=30)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert child.returncode == 0, text[-3000:]
    return text


def frames(text: str) -> list[dict[str, str]]:
    """Every state of the bar the terminal was shown, in order."""
    lines = re.split(r"[\r\n]+", ANSI.sub("", text))
    return [m.groupdict() for line in lines if (m := STATUS.search(line))]


def test_bar_on_this_process_terminal_advances_through_md_with_rate_and_eta(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bar's own console finds the terminal on ``sys.stdout`` (no console given)."""
    # once off the terminal first: what a process's first run loads (numba's kernels,
    # which initialise colorama on the sys.stdout of then) must not keep the terminal
    exec(compile(MD_RUN, "<md-run>", "exec"), {})
    check_md_frames(frames(run_here_on_a_terminal(MD_RUN, monkeypatch)))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bar_in_a_terminal_advances_through_md_with_rate_and_eta() -> None:
    """A real run in a pseudo-terminal (subprocess: a few seconds, mostly imports; the
    same run in this process is the fast test above)."""
    check_md_frames(frames(run_in_pty(CHILD)))


def check_md_frames(shown: list[dict[str, str]]) -> None:
    """What the bar showed of MD_RUN: 2 systems x 32 atoms x 60 steps."""
    budget = 2 * 32 * 60
    assert shown, "the bar printed nothing on a terminal"
    # the budget is known from the start and exact for MD: no '~' or '≤'
    assert {f["total"] for f in shown} == {"3.84k"} and {f["mark"] for f in shown} == {""}
    assert si_value(shown[-1]["done"]) == budget and shown[-1]["finished"] == "2"
    # during the MD stage, before any system finished, the work advances ...
    running = [f for f in shown if f["finished"] == "0"]
    done = [si_value(f["done"]) for f in running]
    assert len(set(done)) >= 5 and done == sorted(done) and 0 < done[-1] < budget
    # ... with a rate and a time left (h:mm:ss)
    timed = [f for f in running if f["rate"] != "--"]
    assert len(timed) >= 3
    valid = [
        f for f in timed if si_value(f["rate"]) > 0 and re.fullmatch(r"\d+:\d\d:\d\d", f["eta"])
    ]
    assert len(valid) >= 3, timed  # (a frame drawn while the machine stalls may lack one)


def test_budget_of_an_optimizer_plan_shrinks_and_ends_at_the_work_done() -> None:
    """Inflight batching (systems not in the batch yet count with their known atoms: an
    upper bound '≤' from the start), an optimizer giving back the steps it did not
    need, and the last frame: exactly the atom-steps done."""
    out = io.StringIO()
    bar = ProgressBar(every=2, console=Console(force_terminal=True, file=out, width=200))
    structures = argon_crystals(n_systems=6, repeat=2, noise=0.1)
    sim = Simulator(
        model=LennardJones(0.0104, 3.40, 6.0),
        stages=FIRE(fmax=0.02, max_steps=80) + Langevin(dt=1.0, temperature=40.0, steps=10),
        callbacks=[bar],
        accelerator="cpu",
        sync_every=2,
    )
    res = sim.run(SizeAwareSampler(structures, max_atoms=70))  # 2 systems of 32 atoms at once
    shown = frames(out.getvalue())
    first_total = si_value(shown[0]["total"])
    assert shown[0]["mark"] == "≤"
    assert first_total == pytest.approx(6 * 32 * 90, rel=5e-3)  # every budget, in full
    totals = [si_value(f["total"]) for f in shown]
    assert totals == sorted(totals, reverse=True)  # never grows
    work = int((res.batch.n_atoms * res.steps).sum())
    assert work < first_total
    last = shown[-1]
    assert (last["finished"], last["systems"]) == ("6", "6")
    assert si_value(last["done"]) == si_value(last["total"]) == pytest.approx(work, rel=5e-3)


class Crash(Exception):
    pass


def test_a_resumed_run_counts_the_work_done_before_the_checkpoint(tmp_path: Path) -> None:
    """Systems that left the batch before the checkpoint are part of the resumed run's
    bar (and of the Logger's end line): its last frame is all the work and all systems."""
    from loguru import logger

    from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback, Logger
    from alchemi_lit.sinks import ZarrSink

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    structures = argon_crystals(n_systems=6, repeat=2, noise=0.1)

    def sim(*extra) -> tuple[Simulator, io.StringIO]:
        out = io.StringIO()
        bar = ProgressBar(every=2, console=Console(force_terminal=True, file=out, width=200))
        return Simulator(
            model=LennardJones(0.0104, 3.40, 6.0),
            stages=FIRE(fmax=0.02, max_steps=80),
            callbacks=[Checkpoint(tmp_path / "ckpt", every=4), bar, Logger(100), *extra],
            sinks=[ZarrSink(tmp_path / "r.zarr", mode="w")],
            accelerator="cpu",
            sync_every=2,
        ), out

    def crash(ctx) -> None:
        if ctx.state["graduated_systems"] >= 3 and ctx.step % 4 == 1:
            raise Crash

    first, _ = sim(LambdaCallback(HookStageEnum.AFTER_STEP, crash))
    try:
        with pytest.raises(Crash):
            first.run(SizeAwareSampler(structures, max_atoms=70))
        again, out = sim()
        res = again.run(SizeAwareSampler(structures, max_atoms=70), resume=str(tmp_path / "ckpt"))
    finally:
        logger.remove(sink)
    shown = frames(out.getvalue())
    assert shown[0]["finished"] != "0"  # graduated before the checkpoint: counted from the start
    last = shown[-1]
    assert (last["finished"], last["systems"]) == ("6", "6")
    assert len(res) == 6  # read back from the store: the systems of both parts
    work = int((res.batch.n_atoms * res.steps).sum())
    assert si_value(last["done"]) == pytest.approx(work, rel=5e-3)
    end = [m for m in lines if m.startswith("run end")][-1]
    assert f"6 systems, {int(res.converged.sum())} converged" in end


@pytest.mark.parametrize(
    ("value", "text"),
    [(999, "999"), (999.6, "1k"), (1000, "1k"), (12345, "12.3k"), (999_499, "999k"),
     (999_999, "1M"), (1e6, "1M"), (2.5e9, "2.5G"), (3e12, "3T"), (0.5, "0.5"),
     (-1500, "-1.5k")],
)  # fmt: skip
def test_si_prefixes_start_at_their_factor(value: float, text: str) -> None:
    """Three significant digits with the largest prefix the value is at least 1 of once
    rounded to them (by hand: 1000 is "1k", not "1000"; 999 999 rounds to 1.00e6, "1M"
    -- it read "1e+03k" -- while 999 499 is "999k")."""
    from alchemi_lit.callbacks.progress import si

    assert si(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00:00"), (59.6, "0:01:00"), (3725, "1:02:05"), (90061, "25:01:01")]
)
def test_clock_is_hours_minutes_seconds(seconds: float, text: str) -> None:
    """h:mm:ss of the rounded seconds (3725 s = 1 h 2 min 5 s; 90061 s = 25 h 1 min 1 s)."""
    from alchemi_lit.callbacks.progress import clock

    assert clock(seconds) == text


class ScriptedClock:
    """``perf_counter`` giving these times, one per reading (the bar reads it once per
    update)."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def perf_counter(self) -> float:
        return self.times.pop(0)


def test_the_rate_is_measured_over_at_least_the_last_ten_seconds(monkeypatch) -> None:
    """One 4-atom system, an update every step, the clock at 0, 1, 2, 11, 12 s while the
    work is 0, 4, 8, 12, 16 atom-steps.  The rate is taken from the newest update at
    least RATE_WINDOW_S = 10 s old: 4/1, 8/2, then at 11 s from the update at 1 s:
    (12 - 4)/(11 - 1) = 0.8, at 12 s from the one at 2 s: (16 - 8)/10 = 0.8 (by hand;
    dropping every update older than 10 s would give (12 - 8)/9 = 0.444 at 11 s)."""
    from ase.build import bulk

    from alchemi_lit.callbacks import progress
    from alchemi_lit.integrators import VelocityVerlet

    monkeypatch.setattr(progress, "time", ScriptedClock(0.0, 1.0, 2.0, 11.0, 12.0, 13.0, 14.0))
    out = io.StringIO()
    bar = ProgressBar(every=1, console=Console(force_terminal=True, file=out, width=250))
    Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=VelocityVerlet(dt=1.0, steps=4),
        callbacks=[bar], accelerator="cpu", sync_every=4,
    ).run([bulk("Ar", "fcc", a=5.26, cubic=True)])  # fmt: skip
    rates = [f["rate"] for f in frames(out.getvalue())]
    assert rates[:5] == ["--", "4", "4", "0.8", "0.8"]


def test_a_monte_carlo_run_shows_its_acceptance() -> None:
    """Swap Monte Carlo: the line carries the acceptance of the chains in flight."""
    from ase.build import bulk

    from alchemi_lit.integrators import SwapMC
    from alchemi_lit.models import EMT

    out = io.StringIO()
    bar = ProgressBar(every=2, console=Console(force_terminal=True, file=out, width=240))
    atoms = bulk("Cu", "fcc", a=3.85, cubic=True)
    atoms.numbers[:2] = 79
    sim = Simulator(model=EMT(), stages=SwapMC(["Cu", "Au"], temperature=2000.0, steps=8),
                    callbacks=[bar], accelerator="cpu", sync_every=2)  # fmt: skip
    sim.run([atoms, atoms.copy()])
    shown = re.findall(r"MC acceptance (\d+\.\d)%", ANSI.sub("", out.getvalue()))
    assert shown and all(0.0 <= float(v) <= 100.0 for v in shown)

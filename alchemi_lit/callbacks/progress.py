"""ProgressBar: a rich progress bar of systems finished out of the run's total.

Why it is built like this: a progress bar needs host values (how many systems have
finished), and the step loop must never wait on the host; so the bar is updated
every ``frequency`` steps from one small device -> host copy and costs nothing in
between.  It shows systems done / total, steps/s and atom-steps/s (active atoms x
steps/s over the last interval).

The bar turns itself off (no output at all) when the console is not a terminal
(CI logs, files, pipes, notebooks without a terminal) or when ``enable=False``, so
logs never fill with control codes.  The live display is started in ``on_run_start``
and stopped in ``on_run_end``, which the strategy also calls when the run fails,
so the terminal is always restored.  ``transient=False``: the final bar stays on
screen.
"""

from __future__ import annotations

import contextlib
import time

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from ..hooks import Callback, StepContext


class ProgressBar(Callback):
    """Rich progress bar of finished systems (see module docstring).

    Args:
        frequency: loop steps between two updates (>= 1).
        enable: False turns the bar off.
        console: rich console to draw on (default: a new ``Console()`` on stdout); the
            bar is only shown when ``console.is_terminal``.
        description: text in front of the bar.
    """

    def __init__(
        self,
        frequency: int = 10,
        enable: bool = True,
        console: Console | None = None,
        description: str = "systems",
    ) -> None:
        super().__init__(frequency)
        if console is not None and not isinstance(console, Console):
            raise TypeError(
                f"ProgressBar: console must be a rich.console.Console, got {type(console).__name__}"
            )
        self.enable = bool(enable)
        self.console = console
        self.description = str(description)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last: tuple[int, float] = (0, 0.0)

    @property
    def active(self) -> bool:
        """True while a live bar is on screen."""
        return self._progress is not None

    def _enabled(self, console: Console) -> bool:
        return self.enable and console.is_terminal and not console.is_dumb_terminal

    # ---------------------------------------------------------------- hooks
    def on_run_start(self, ctx: StepContext) -> None:
        console = self.console if self.console is not None else Console()
        if not self._enabled(console):
            return
        total = int(ctx.state.get("total_systems", ctx.batch.num_systems))
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[steps_per_s]:>8.1f} steps/s"),
            TextColumn("{task.fields[atom_steps_per_s]:>9.3g} atom-steps/s"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            auto_refresh=False,  # refreshed at our frequency: no timer thread
        )
        self._task = progress.add_task(
            self.description, total=total, steps_per_s=0.0, atom_steps_per_s=0.0
        )
        progress.start()
        progress.refresh()
        self._progress = progress
        self._last = (ctx.step, time.perf_counter())

    def after_step(self, ctx: StepContext) -> None:
        if self._progress is not None:
            self._update(ctx, ctx.step + 1)  # step ctx.step has just completed

    def _update(self, ctx: StepContext, steps_done: int) -> None:
        assert self._progress is not None and self._task is not None
        b = ctx.batch
        done = int(ctx.state.get("graduated_systems", 0))
        active_atoms = 0
        if b.num_systems:
            exit_code = ctx.state.get("exit_code", -1)
            active = (b.status >= 0) & (b.status != exit_code)
            counts = torch.stack(
                [(b.status == exit_code).sum(), torch.where(active, b.n_atoms, 0).sum()]
            ).tolist()  # one host copy per update
            done += int(counts[0])
            active_atoms = int(counts[1])
        now = time.perf_counter()
        step0, t0 = self._last
        rate = (steps_done - step0) / (now - t0) if now > t0 and steps_done > step0 else 0.0
        self._last = (steps_done, now)
        total = ctx.state.get("total_systems")
        self._progress.update(
            self._task,
            completed=done,
            total=int(total) if total is not None else None,
            steps_per_s=rate,
            atom_steps_per_s=rate * active_atoms,
        )
        self._progress.refresh()

    def on_run_end(self, ctx: StepContext) -> None:
        progress = self._progress
        if progress is None:
            return
        try:
            # a last update; cosmetic, so it never masks the error of a failed run
            with contextlib.suppress(Exception):
                self._update(ctx, ctx.step)
        finally:
            self._progress = None
            progress.stop()

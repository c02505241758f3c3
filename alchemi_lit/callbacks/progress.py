"""ProgressBar: a rich progress bar of the run's work, in atom-steps, with rate and ETA.

What it counts: a run's work is atom-steps (a system of n atoms taking one step is n),
and its budget is known before it starts -- every stage has a step budget (an MD
stage's ``steps``, an optimizer's ``max_steps``), so a system of n atoms entering a
plan will take at most ``n x (sum of the budgets)`` atom-steps.  The bar shows the
atom-steps done out of the budget still possible (done + what the systems not yet
finished may still take), the rate (atom-steps/s over the last ten seconds), the time
left at that rate, and systems finished / total.  For MD the budget is exact; an
optimizer that converges early gives back the rest of its budget, so the total
shrinks and is marked ``≤`` (and the ETA is an upper bound).  Counting finished
systems instead stalls at 0/1 through a long MD run.

Systems not in the batch yet (inflight batching) are counted at the mean size of the
systems seen so far (the total is marked ``~`` while there are such systems).

A run with band stages (``FIRE(band=NEB(...))``) relaxes bands, not systems: the bar
then also counts bands -- converged, running, waiting (images whose endpoints are
still relaxing), unconverged (budget spent) and quarantined -- each band counted once,
by its first interior image, out of the run's bands where they are known.  A replica
exchange (``ReplicaExchange``) adds its ladder, the acceptance of each neighbour pair
and the round trips of the replicas in the batch.

Why it is built like this: the step loop must never wait on the host, so the bar
reads the batch every ``every`` steps in one small device -> host copy (plus one
at each bookkeeping where systems leave the batch, to keep their atom-steps) and
costs nothing in between.

The bar turns itself off (no output at all) when the console is not a terminal (CI
logs, files, pipes, notebooks without a terminal) or when ``enable=False``, so logs
never fill with control codes.  The live display is started in ``on_run_start`` and
stopped in ``on_run_end``, which the strategy also calls when the run fails, so the
terminal is always restored.  ``transient=False``: the final bar stays on screen.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from ..core.state import Batch
from ..engine.hooks import Callback, StepContext
from ..engine.status import failed_exit
from ..integrators.tempering import ReplicaExchange
from .logger import stage_codes
from .rank_board import RankBoard, RankCounts

#: seconds of history the rate is measured over
RATE_WINDOW_S = 10.0


def si(value: float) -> str:
    """``12345`` -> ``"12.3k"``: three significant digits and an SI prefix (the largest
    prefix the value is at least 1 of once rounded: 999 999 is ``"1M"``)."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        scaled = f"{value / factor:.3g}"
        if abs(float(scaled)) >= 1:
            return f"{scaled}{prefix}"
    return f"{value:.3g}" if value != int(value) else str(int(value))


def clock(seconds: float) -> str:
    """``3725`` -> ``"1:02:05"``."""
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ProgressBar(Callback):
    """Rich progress bar of the run's atom-steps, rate and ETA (see module docstring).

    In a multi-rank run (pipeline, replicas) every rank runs its own loop and only rank
    0 draws.  Replicas: every rank posts its counts (:mod:`.rank_board`) and rank 0's
    bar, labelled ``[N replicas]``, counts them all -- a replica that has not posted
    yet by its share of the data -- and says how many are still running when rank 0's
    own share is done.  A pipeline's rank 0 (``[rank 0 of N]``) counts what passes
    through it: every system, on its first stage.  The run's summary counts every
    rank's systems.

    Args:
        every: loop steps between two updates (>= 1).
        enable: False turns the bar off.
        console: rich console to draw on (default: a new ``Console()`` on stdout); the
            bar is only shown when ``console.is_terminal``.
        description: text in front of the bar.
    """

    def __init__(
        self,
        every: int = 10,
        enable: bool = True,
        console: Console | None = None,
        description: str = "run",
    ) -> None:
        super().__init__(every)
        if console is not None and not isinstance(console, Console):
            raise TypeError(
                f"ProgressBar: console must be a rich.console.Console, got {type(console).__name__}"
            )
        self.enable = bool(enable)
        self.console = console
        self.description = str(description)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._history: deque[tuple[float, int, int]] = deque()  # (time, atom-steps, loop step)
        self._left_batch = [0, 0, 0]  # atom-steps, atoms, systems of systems that left the batch
        self._restored = False
        self._remaining_of: torch.Tensor | None = None  # status code -> steps still possible
        self._optimizing = False
        self._bands = False  # the loop runs a band stage: count bands too
        self._ladder: list[float] | None = None  # a replica exchange's ladder (K)
        self._left_rex: list[int] = []  # its counts of the replicas that left the batch
        self._left_bands = [0, 0, 0]  # converged, unconverged, quarantined bands that left
        self._board: RankBoard | None = None  # replicas: every rank's counts (rank 0 reads)

    @property
    def active(self) -> bool:
        """True while a live bar is on screen."""
        return self._progress is not None

    def _enabled(self, console: Console) -> bool:
        return self.enable and console.is_terminal and not console.is_dumb_terminal

    # ---------------------------------------------------------------- hooks
    def on_run_start(self, ctx: StepContext) -> None:
        if not self._restored:  # a resumed run keeps what left the batch before
            self._left_batch, self._left_bands, self._left_rex = [0, 0, 0], [0, 0, 0], []
        self._restored = False
        console = self.console if self.console is not None else Console()
        folder = ctx.state.get("progress_dir") if self.enable else None
        ranks = ctx.state.get("ranks", 1)
        self._board = None if folder is None else RankBoard(folder, ctx.rank or 0, ranks)
        drawn = self._enabled(console) and ctx.rank in (None, 0)
        if not drawn and self._board is None:
            return  # (one bar on a terminal: rank 0's -- see the class docstring)
        self._remaining_of = self._budget_table(ctx)
        self._optimizing = any(getattr(s, "is_optimizer", False) for s in ctx.stages)
        self._bands = any(getattr(s, "band", None) is not None for s in ctx.stages)
        ladders = [s.temperatures for s in ctx.stages if isinstance(s, ReplicaExchange)]
        self._ladder = ladders[0] if ladders else None
        if not drawn:  # a replica that posts its counts for rank 0's bar
            return
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=30),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            # prints go above the bar only where the bar is on the process's own
            # terminal: a console drawing into a file must not capture sys.stdout
            redirect_stdout=console.file in (sys.stdout, sys.stderr),
            redirect_stderr=console.file in (sys.stdout, sys.stderr),
            transient=False,
            auto_refresh=False,  # refreshed at our every: no timer thread
        )
        ranks = ctx.state.get("ranks", "?")
        where = "" if ctx.rank is None else f" [rank 0 of {ranks}]"
        where = f" [{ranks} replicas]" if self._board is not None else where
        label = escape(self.description + where)  # (the column reads rich markup)
        self._task = progress.add_task(label, total=None, status="starting")
        progress.start()
        self._progress = progress
        self._history = deque()
        self._update(ctx, ctx.step)

    def _budget_table(self, ctx: StepContext) -> torch.Tensor:
        """``[max code + 1]`` steps a system may still take from the start of the stage
        with that status code (its budget and the later stages'); 0 at the exit code."""
        codes, _ = stage_codes(ctx)
        exit_code = int(ctx.state.get("exit_code", max(codes, default=-1) + 1))
        table = torch.zeros(max([*codes, exit_code]) + 1, dtype=torch.int64)
        left = 0
        for code, stage in reversed(list(zip(codes, ctx.stages))):
            left += int(stage.max_steps)
            table[code] = left
        return table.to(ctx.batch.device)

    def _posting(self) -> bool:
        return self._progress is None and self._board is not None

    def after_step(self, ctx: StepContext) -> None:
        if self._posting():
            assert self._board is not None
            self._board.post(self._counts(ctx)[0])
        elif self._progress is not None:
            self._update(ctx, ctx.step + 1)  # step ctx.step has just completed

    def on_converge(self, ctx: StepContext) -> None:
        # systems about to leave the batch take their atom-steps with them: keep them
        counting = self._progress is not None or self._posting()
        if not counting or ctx.graduated is None or ctx.batch.num_systems == 0:
            return
        b, rows = ctx.batch, ctx.graduated
        sums = [
            torch.where(rows, b.n_atoms * b.total_steps, 0).sum(),
            torch.where(rows, b.n_atoms, 0).sum(),
            rows.sum(),
        ]
        sums += self._band_counts(b, rows, ctx.exit_code)[:3] if self._bands else []
        rex = self._exchange_counts(b, rows)
        sums = torch.stack([*sums, *rex]).tolist()  # one host copy, where systems leave
        self._left_batch = [a + int(v) for a, v in zip(self._left_batch, sums)]
        self._left_bands = [a + int(v) for a, v in zip(self._left_bands, sums[3:])]
        if rex:
            gone = sums[len(sums) - len(rex):]
            self._left_rex = [a + int(v) for a, v in zip(self._left_rex or [0] * len(rex), gone)]

    def _band_counts(self, b: Batch, rows: torch.Tensor, exit_code: int) -> list[torch.Tensor]:
        """Converged, unconverged, quarantined, running and waiting bands among ``rows``
        ``[B]`` (each band by its first interior image)."""
        head = rows & (b.neb_image == 1)
        done, failed = b.status == exit_code, failed_exit(b.exit_code)
        ok = head & done & ~failed
        return [
            (ok & b.converged).sum(), (ok & ~b.converged).sum(), (head & done & failed).sum(),
            (head & ~done & b.neb_running).sum(), (head & ~done & ~b.neb_running).sum(),
        ]  # fmt: skip

    def _batch_counts(self, ctx: StepContext) -> list[int]:
        """Atom-steps done, atom-steps still possible, atoms, systems and finished systems
        of the batch, in one host copy."""
        b = ctx.batch
        if b.num_systems == 0 or self._remaining_of is None:
            return [0] * (10 if self._bands else 5) + self._exchange_counts(None)
        exit_code = ctx.state.get("exit_code", -1)
        table = self._remaining_of
        status = b.status
        budget = (table[status.clamp(0, table.numel() - 1)] - b.step).clamp_min(0)
        # a negative status: added at a refill, entering the plan after the next forward
        left = torch.where(status < 0, table.max(), budget)
        counts = [
            (b.n_atoms * b.total_steps).sum(),
            (b.n_atoms * left).sum(),
            b.n_atoms.sum(),
            torch.tensor(b.num_systems, device=b.device),
            (status == exit_code).sum(),
        ]
        if self._bands:
            counts += self._band_counts(b, torch.ones_like(status, dtype=torch.bool), exit_code)
        if b.has_field("mc_attempts"):  # a Monte Carlo chain's acceptance, systems in flight
            counts += [b.mc_accepted.sum(), b.mc_attempts.sum()]
        return torch.stack([*counts, *self._exchange_counts(b)]).tolist()

    def _exchange_counts(self, b: Batch | None, rows: torch.Tensor | None = None) -> list[Any]:
        """Accepted and attempted exchanges per neighbour pair and round trips of the
        replicas in the batch (of ``rows``; none without a replica exchange)."""
        if self._ladder is None:
            return []
        if b is None or not b.has_field("rex_accepts"):
            return [torch.tensor(0)] * (2 * len(self._ladder) - 1)
        keep = torch.ones_like(b.rex_group, dtype=torch.bool) if rows is None else rows
        acc, att = (torch.where(keep.unsqueeze(-1), f, 0).sum(0) for f in (b.rex_accepts,
                                                                           b.rex_attempts))
        return [*acc, *att, torch.where(keep, b.rex_round_trips, 0).sum()]

    def _exchange_text(self, counts: list[int]) -> str:
        """``"ladder 300-1200 K (4): accepted 41% 38% 40%, 3 round trips"``."""
        t, pairs = self._ladder or [], len(counts) // 2
        rates = " ".join(
            f"{100 * a / n:.0f}%" if n else "--" for a, n in zip(counts[:pairs], counts[pairs:-1])
        )
        return f"ladder {t[0]:g}-{t[-1]:g} K ({len(t)}): accepted {rates}, {counts[-1]} round trips"

    def _counts(
        self, ctx: StepContext
    ) -> tuple[RankCounts, list[int], tuple[int, int], list[int]]:
        """This loop's counts (what it posts for rank 0), its band counts, its Monte
        Carlo chains' ``(accepted, attempts)`` (systems in flight) and its replica
        exchange's counts (:meth:`_exchange_counts`, this rank's replicas)."""
        counts = self._batch_counts(ctx)
        n_rex = len(self._exchange_counts(None))  # (last: a replica exchange's counts)
        rex = [int(a) + g for a, g in zip(counts[len(counts) - n_rex:], self._left_rex or
                                          [0] * n_rex)] if n_rex else []  # fmt: skip
        counts = counts[: len(counts) - n_rex]
        mc = ctx.batch.has_field("mc_attempts") and len(counts) > (10 if self._bands else 5)
        chains = (int(counts[-2]), int(counts[-1])) if mc else (0, 0)
        done_b, left_b, atoms_b, systems_b, finished_b, *bands = counts[:-2] if mc else counts
        gone_work, gone_atoms, gone_systems = self._left_batch
        done = gone_work + int(done_b)
        total_systems = ctx.state.get("total_systems")
        seen = gone_systems + int(systems_b)
        unseen = max(int(total_systems) - seen, 0) if total_systems is not None else 0
        mean_atoms = (gone_atoms + int(atoms_b)) / seen if seen else 0.0
        total_atoms = ctx.state.get("total_atoms")  # known exactly on one device
        unseen_atoms = (
            max(int(total_atoms) - gone_atoms - int(atoms_b), 0)
            if total_atoms is not None
            else unseen * mean_atoms
        )
        left = int(left_b) + round(unseen_atoms * self._entry_budget())
        estimated = bool(unseen and total_atoms is None)
        finished = gone_systems + int(finished_b)
        return RankCounts(done, left, finished, total_systems, estimated), bands, chains, rex

    def _entry_budget(self) -> int:
        return int(self._remaining_of.max()) if self._remaining_of is not None else 0

    def _with_other_ranks(self, ctx: StepContext, own: RankCounts) -> tuple[RankCounts, int]:
        """``own`` plus every other replica's posted counts (one that has not posted:
        its share, untouched), and how many other replicas are still running."""
        if self._board is None:
            return own, 0
        shares = ctx.state.get("rank_shares") or {}
        done, left, finished = own.done, own.left, own.finished
        total, estimated, running = own.total_systems, own.estimated, 0
        posted = self._board.others()
        for r in range(self._board.ranks):
            if r == self._board.rank:
                continue
            c = posted.get(r)
            if c is None:
                systems, atoms = shares.get(r, (None, 0))
                c = RankCounts(0, int(atoms) * self._entry_budget(), 0, systems)
            done, left, finished = done + c.done, left + c.left, finished + c.finished
            total = None if total is None or c.total_systems is None else total + c.total_systems
            estimated |= c.estimated
            running += c.total_systems is None or c.finished < c.total_systems
        return RankCounts(done, left, finished, total, estimated), running

    def _update(self, ctx: StepContext, steps_done: int) -> None:
        assert self._progress is not None and self._task is not None
        own, bands, (accepted, attempts), rex = self._counts(ctx)
        counts, running = self._with_other_ranks(ctx, own)
        done, left, finished, total_systems = (
            counts.done, counts.left, counts.finished, counts.total_systems
        )  # fmt: skip
        now = time.perf_counter()
        history = self._history
        history.append((now, done, steps_done))
        while len(history) > 2 and now - history[1][0] >= RATE_WINDOW_S:
            history.popleft()
        t0, done0, step0 = history[0]
        rate = (done - done0) / (now - t0) if now > t0 else 0.0
        steps_rate = (steps_done - step0) / (now - t0) if now > t0 else 0.0
        mark = "~" if counts.estimated else ("≤" if self._optimizing and left else "")
        parts = [
            f"{si(done)}/{mark}{si(done + left)} atom-steps",
            f"{finished}/{total_systems if total_systems is not None else '?'} systems",
            *([self._band_text(ctx, bands)] if bands else []),
            *([f"MC acceptance {accepted / attempts:.1%}"] if attempts else []),
            *([self._exchange_text(rex)] if rex else []),
            f"{si(rate)} atom-steps/s ({steps_rate:.0f} steps/s)" if rate else "-- atom-steps/s",
            f"ETA {'≤' if mark == '≤' else ''}{clock(left / rate)}" if rate and left else "ETA --",
            *([f"{running} other replica(s) running"] if running else []),
        ]
        self._progress.update(
            self._task, completed=done, total=max(done + left, 1), status=" | ".join(parts)
        )
        self._progress.refresh()

    def _band_text(self, ctx: StepContext, in_batch: list[int]) -> str:
        """``"2/8 bands converged, 1 running, 3 waiting, 0 quarantined"`` (plus unconverged
        bands, those that spent their budget, when there are any)."""
        conv, unconv, quar = (a + int(v) for a, v in zip(self._left_bands, in_batch))
        running, waiting = (int(v) for v in in_batch[3:])
        total = ctx.state.get("total_bands", "?")
        more = f", {unconv} unconverged" if unconv else ""
        return (
            f"{conv}/{total} bands converged, {running} running, {waiting} waiting{more}, "
            f"{quar} quarantined"
        )

    def on_run_end(self, ctx: StepContext) -> None:
        if self._posting():  # this replica's last counts, whatever the interval
            assert self._board is not None
            with contextlib.suppress(Exception):
                self._board.post(self._counts(ctx)[0], force=True)
            return
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

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"left_batch": list(self._left_batch), "left_bands": list(self._left_bands),
                "left_exchanges": list(self._left_rex)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._left_batch = [int(v) for v in state.get("left_batch", [0, 0, 0])]
        self._left_bands = [int(v) for v in state.get("left_bands", [0, 0, 0])]
        self._left_rex = [int(v) for v in state.get("left_exchanges", [])]
        self._restored = True

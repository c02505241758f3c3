"""Logger: periodic one-line run reports and an end-of-run summary through loguru.

Why a callback and not prints in the loop: the step loop never waits on the host.
Reading energies or counts means a device -> host copy, so the logger gathers every
statistic of a report into one small tensor and copies it once, every ``every``
steps; the steps in between cost nothing.

A report (``AFTER_STEP``, every ``every`` steps) holds: the loop step, the
number of systems per status code (one entry per stage, plus the exit code), the
systems finished so far, mean/min/max energy per atom and the largest atomic
force over the *active* systems (those inside a stage), and steps/s since the last
report; with NPT stages (a barostat) also the mean pressure (GPa, ideal-gas term
included) and volume (Å^3) of their systems.  At run end a summary gives systems,
converged (``completed`` for a plan without an optimizer stage), quarantined,
exit-reason counts, wall time and atom-steps/s (``sum(n_atoms * steps)`` of every
system over the wall time).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from loguru import logger

from ..core.fields import FAILED_EXITS
from ..core.state import EXIT_COMPLETED, EXIT_REASONS, EXIT_RUNNING
from ..core.tensor_ops import row_dot
from ..core.units import GPa
from ..engine.hooks import Callback, StepContext
from ..integrators.barostat import instantaneous_pressure


def stage_codes(ctx: StepContext) -> tuple[list[int], list[str]]:
    """Status codes of the stages this loop runs and their labels (``"0:FIRE"``).

    The fused plan running here is the simulator's plan or, for pipelines, the rank
    plan whose stages are ``ctx.stages``; plans without explicit codes use ``0..k-1``.
    """
    plan = getattr(ctx.simulator, "plan", None)
    ranks = getattr(plan, "stages", None)
    candidates = [plan, *(ranks.values() if isinstance(ranks, dict) else ())]
    codes: list[int] = list(range(len(ctx.stages)))
    for p in candidates:
        p_codes = getattr(p, "codes", None)
        if getattr(p, "stages", None) is ctx.stages and p_codes is not None:
            codes = list(p_codes)
            break
    names = [f"{c}:{type(s).__name__}" for c, s in zip(codes, ctx.stages)]
    return codes, names


def active_mask(ctx: StepContext) -> torch.Tensor:
    """``[B]`` systems inside a stage: neither finished nor waiting for their forces."""
    status = ctx.batch.status
    return (status >= 0) & (status != ctx.state.get("exit_code", -1))


def npt_sums(ctx: StepContext, codes: list[int]) -> list[torch.Tensor]:
    """Systems in barostat stages, and the sums of their pressures (GPa) and volumes
    (Å^3), as 0-d tensors; nothing when no stage is a barostat."""
    barostats = [c for c, s in zip(codes, ctx.stages) if getattr(s, "barostat", False)]
    if not barostats:
        return []
    b = ctx.batch
    rows = (b.status.unsqueeze(1) == torch.tensor(barostats, device=b.device)).any(1)
    zero = torch.zeros_like(b.energy)
    p = torch.where(rows, instantaneous_pressure(b) / GPa, zero)
    return [rows.sum().to(b.dtype), p.sum(), torch.where(rows, b.volume, zero).sum()]


class Logger(Callback):
    """Log run progress every ``every`` steps and a summary at the end (see module doc).

    Args:
        every: loop steps between two reports (>= 1).
        level: loguru level name (``"INFO"``, ``"DEBUG"`` ...) or number of the messages.
    """

    def __init__(self, every: int = 100, level: str | int = "INFO") -> None:
        super().__init__(every)
        if isinstance(level, bool) or not isinstance(level, (str, int)):
            raise TypeError(f"Logger: level must be a loguru level name or int, got {level!r}")
        if isinstance(level, str):
            try:
                logger.level(level)
            except ValueError as exc:
                raise ValueError(
                    f"Logger: unknown loguru level {level!r}; use e.g. 'DEBUG', 'INFO', "
                    f"'SUCCESS', 'WARNING' or a level added with logger.level(...)"
                ) from exc
        self.level = level
        self._t0 = 0.0
        self._last: tuple[int, float] = (0, 0.0)
        # system_id -> (exit_code, converged, atom_steps) of systems that finished
        self._finished: dict[int, tuple[int, bool, int]] = {}
        self._restored = False  # loaded from a checkpoint: the run start keeps _finished
        self._prefix = ""  # "rank r/n | " in a multi-rank run: every rank logs

    def _log(self, message: str) -> None:
        logger.log(self.level, self._prefix + message)

    # ---------------------------------------------------------------- hooks
    def on_run_start(self, ctx: StepContext) -> None:
        ranks = ctx.state.get("ranks")
        self._prefix = "" if ctx.rank is None else f"rank {ctx.rank}/{ranks or '?'} | "
        self._t0 = time.perf_counter()
        self._last = (ctx.step, self._t0)
        if not self._restored:  # a resumed run keeps the systems finished before
            self._finished = {}
        self._restored = False
        b = ctx.batch
        total = ctx.state.get("total_systems", b.num_systems)
        plan = getattr(ctx.simulator, "plan", None)
        self._log(
            f"run start: {total} systems, {b.num_systems} in the first batch "
            f"({b.num_atoms} atoms), plan {plan!r}, device {b.device}"
        )

    def after_step(self, ctx: StepContext) -> None:
        b = ctx.batch
        now = time.perf_counter()
        codes, names = stage_codes(ctx)
        exit_code = int(ctx.state.get("exit_code", max(codes, default=-1) + 1))
        done_before = int(ctx.state.get("graduated_systems", 0))
        if b.num_systems == 0:
            self._log(f"step {ctx.step:>7} | no systems in the batch | finished {done_before}")
            self._last = (ctx.step + 1, now)
            return
        all_codes = torch.tensor([*codes, exit_code], device=b.device)
        counts = (b.status.unsqueeze(1) == all_codes).sum(0).to(b.dtype)
        active = active_mask(ctx)
        epa = b.energy / b.n_atoms.to(b.dtype)
        f2 = row_dot(b.forces)
        f2_sys = f2.new_zeros(b.num_systems).scatter_reduce(
            0, b.system_idx, f2, "amax", include_self=True
        )
        inf = torch.full_like(epa, float("inf"))
        stats = torch.stack(
            [
                active.sum().to(b.dtype),
                torch.where(active, epa, torch.zeros_like(epa)).sum(),
                torch.where(active, epa, inf).min(),
                torch.where(active, epa, -inf).max(),
                torch.where(active, f2_sys, torch.zeros_like(f2_sys)).max().sqrt(),
                *npt_sums(ctx, codes),
            ]
        )
        host = torch.cat([counts, stats]).tolist()  # the one host copy of a report
        n_codes = len(codes) + 1
        per_code, (n_active, e_sum, e_min, e_max, fmax) = host[:n_codes], host[n_codes:][:5]
        npt = host[n_codes + 5 :]
        step0, t_last = self._last
        steps_done = ctx.step + 1  # AFTER_STEP: step ctx.step has just completed
        rate = (steps_done - step0) / (now - t_last) if now > t_last and steps_done > step0 else 0.0
        self._last = (steps_done, now)
        stages = " ".join(f"{n}={int(c)}" for n, c in zip(names, per_code))
        finished = done_before + int(per_code[-1])
        total = ctx.state.get("total_systems")
        done = f"{finished}/{total}" if total is not None else f"{finished}"
        if n_active > 0:
            energy = (
                f"E/atom mean {e_sum / n_active:.6f} min {e_min:.6f} max {e_max:.6f} eV | "
                f"fmax {fmax:.3e} eV/Å"
            )
        else:
            energy = "no active systems"
        if npt and npt[0] > 0:
            energy += f" | NPT P {npt[1] / npt[0]:.4f} GPa, V {npt[2] / npt[0]:.2f} Å^3 (mean)"
        self._log(
            f"step {ctx.step:>7} | {stages} exit={int(per_code[-1])} | finished {done} | "
            f"{energy} | {rate:.1f} steps/s"
        )

    def on_converge(self, ctx: StepContext) -> None:
        # Systems about to leave the batch (inflight batching) are tallied now: at run
        # end they are gone.  Only the rare bookkeeping with exits pays for this copy.
        b = ctx.batch
        done = (
            ctx.graduated
            if ctx.graduated is not None
            else b.status == ctx.state.get("exit_code", -1)
        )
        self._tally(ctx, done)

    def _tally(self, ctx: StepContext, rows: torch.Tensor) -> None:
        b = ctx.batch
        if b.num_systems == 0:
            return
        idx = rows.nonzero().flatten()
        if idx.numel() == 0:
            return
        data = torch.stack(
            [
                b.system_id[idx],
                b.exit_code[idx],
                b.converged[idx].long(),
                b.n_atoms[idx] * b.total_steps[idx],
            ]
        ).tolist()
        for sid, code, conv, atom_steps in zip(*data):
            self._finished[int(sid)] = (int(code), bool(conv), int(atom_steps))

    def on_run_end(self, ctx: StepContext) -> None:
        try:
            self._summary(ctx)
        except Exception as exc:  # a failed run's batch may be half-updated: never mask its error
            logger.warning(f"Logger: could not write the run summary: {exc!r}")

    def _summary(self, ctx: StepContext) -> None:
        wall = time.perf_counter() - self._t0 if self._t0 else 0.0
        b = ctx.batch
        # what is still in the batch: finished systems not yet graduated and, when the
        # run failed, systems still running (exit code 0)
        self._tally(ctx, torch.ones(b.num_systems, dtype=torch.bool, device=b.device))
        records = list(self._finished.values())
        reasons: dict[str, int] = {}
        for code, _, _ in records:
            name = EXIT_REASONS.get(code, f"code {code}")
            reasons[name] = reasons.get(name, 0) + 1
        atom_steps = sum(r[2] for r in records)
        converged = sum(r[1] for r in records)
        completed = sum(r[0] == EXIT_COMPLETED for r in records)
        quarantined = sum(r[0] in FAILED_EXITS for r in records)  # NaNGuard or model errors
        running = sum(r[0] == EXIT_RUNNING for r in records)
        graduated = int(ctx.state.get("graduated_systems", 0))
        systems = max(len(records), graduated + b.num_systems)
        reason_text = ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "none"
        rate = atom_steps / wall if wall > 0 else 0.0
        # "converged" means every optimizer stage met its criterion: MD alone completes
        optimizing = any(getattr(s, "is_optimizer", False) for s in ctx.stages)
        outcome = f"{converged} converged" if optimizing else f"{completed} completed"
        note = getattr(getattr(ctx.simulator, "model", None), "summary_note", None)  # slow path
        self._log(
            f"run end: {systems} systems, {outcome}, {quarantined} quarantined"
            f"{f', {running} unfinished' if running else ''} | exit reasons: {reason_text} | "
            f"{ctx.step} steps in {wall:.2f} s | {rate:.3g} atom-steps/s"
            + (f" | {note}" if note else "")
        )

    def state_dict(self) -> dict[str, Any]:
        return {"finished": dict(self._finished)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._finished = dict(state.get("finished", {}))
        self._restored = True

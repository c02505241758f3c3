"""FIRE 2.0 structure optimizer (Guénolé et al., Comput. Mater. Sci. 175, 109584, 2020).

Why: FIRE 2.0 integrates with semi-implicit Euler (velocity first, then position),
which the paper shows to be the most robust choice, waits ``n_min`` downhill steps
before accelerating, and on an uphill step (``P = F·v <= 0``) steps *back* by half a
step before restarting -- fewer oscillations around the minimum than FIRE 1.
``use_abc`` selects ABC-FIRE (Echeverri Restrepo & Andric, Comput. Mater. Sci. 218,
111978, 2023): the velocity mixing is bias-corrected by ``1/(1 - (1 - a)^(n+1))`` and
velocities are clipped per Cartesian component.

The update is ``ase.optimize.fire2.FIRE2``'s, parameter for parameter (defaults equal
ASE's; times in fs).  One difference is forced by the one-force-call-per-step loop:
after the half step back ASE evaluates the forces at the backed-off positions and then
takes its Euler step within the same ``step()`` -- two force calls.  Here the half
step back is a step of its own (flag ``fire2_back``): its force call gives the forces
the Euler step of the next step uses, and convergence is not tested at the backed-off
positions (ASE does not test there either).  Positions after each Euler step agree with
ASE to round-off; the step count is ASE's number of force calls after the first one
(ASE's ``nsteps`` plus its uphill restarts), and ``max_steps`` bounds force calls.

State per system: ``fire2_dt``, ``fire2_alpha``, ``fire2_n`` and ``fire2_back``.  The
update is :func:`~.ops.fire2_update`; its decisions :func:`~.formulas.fire2_coefficients`.
With ``cell=`` it is ASE's FIRE2 on a cell filter, as :mod:`.fire` describes for FIRE
(ABC-FIRE clips the cell rows' velocities per component too).
"""

from __future__ import annotations

import math
from functools import partial
from typing import ClassVar

import torch

from ..core.state import Batch
from ..core.units import fs
from . import formulas, ops
from .base import FieldSpec
from .cell import CellFilter
from .convergence import Criterion
from .extended import CellOptimizer, inertial_fields, inertial_step
from .params import TIME_STEP, check_count, check_param, check_range

#: ASE's FIRE2 defaults (ASE time units) expressed in femtoseconds.
ASE_FIRE2_DT_FS = 0.1 / fs
ASE_FIRE2_DTMAX_FS = 1.0 / fs
ASE_FIRE2_DTMIN_FS = 2e-3 / fs


class FIRE2(CellOptimizer):
    """FIRE 2.0 (or ABC-FIRE with ``use_abc``); converges when max |F| < ``fmax``.

    Args:
        fmax: force threshold in eV/Å: converged when every atom's force (and with
            ``cell``, every cell row's force) is below it.
        max_steps: the stage's step budget (force calls, half steps back included).
        dt: initial time step in fs (ASE's 0.1 ASE time units).
        maxstep: largest displacement per step in Å (ABC-FIRE: per component).
        dtmax: largest time step in fs (ASE's 1.0 ASE time unit).
        dtmin: smallest time step in fs (ASE's 0.002 ASE time units).
        n_min: downhill steps before the time step may grow.
        finc: time-step growth factor on a downhill step, >= 1 (dimensionless).
        fdec: time-step shrink factor on an uphill step, in (0, 1] (dimensionless).
        astart: initial velocity-mixing parameter alpha (dimensionless).
        fa: alpha's decay factor on growing steps (dimensionless).
        use_abc: ABC-FIRE: bias-corrected mixing and per-component velocity clipping.
        cell: relax the cell too: a :class:`CellFilter`, ``"frechet"`` or ``"unit"``
            (ASE's FIRE2 on ``FrechetCellFilter`` / ``UnitCellFilter``); None: positions.
        criterion: convergence criterion instead of ``ForceMax(fmax)``.
    """

    fields: ClassVar[dict[str, FieldSpec]] = {
        "fire2_dt": FieldSpec("system", fill=float("nan")),
        "fire2_alpha": FieldSpec("system", fill=float("nan")),
        "fire2_n": FieldSpec("system", dtype="int64", fill=0),
        "fire2_back": FieldSpec("system", dtype="bool", fill=False),
    }

    def __init__(
        self,
        fmax: float = 0.05,
        max_steps: int = 1000,
        dt: float = ASE_FIRE2_DT_FS,
        maxstep: float = 0.2,
        dtmax: float = ASE_FIRE2_DTMAX_FS,
        dtmin: float = ASE_FIRE2_DTMIN_FS,
        n_min: int = 20,
        finc: float = 1.1,
        fdec: float = 0.5,
        astart: float = 0.25,
        fa: float = 0.99,
        use_abc: bool = False,
        cell: CellFilter | str | None = None,
        criterion: Criterion | None = None,
    ) -> None:
        super().__init__(fmax, max_steps, maxstep, cell, criterion)
        name = type(self).__name__
        self.fields.update(inertial_fields(self.view))
        self.dt0 = check_param("dt", name, dt, unit="fs", usual=TIME_STEP) * fs
        self.dtmax = check_param("dtmax", name, dtmax, unit="fs") * fs
        self.dtmin = check_param("dtmin", name, dtmin, unit="fs") * fs
        if self.dtmin > self.dtmax:
            raise ValueError(f"{name}: dtmin must be <= dtmax, got {dtmin} > {dtmax} fs")
        self.finc = check_range(name, "finc", finc, 1.0, math.inf)
        self.fdec = check_param("fdec", name, fdec)
        check_range(name, "fdec", fdec, 0.0, 1.0)
        self.astart = check_param("astart", name, astart)
        self.fa = check_param("fa", name, fa)
        self.n_min = check_count(name, "n_min", n_min)
        self.use_abc = bool(use_abc)

    def __repr__(self) -> str:
        abc = ", use_abc=True" if self.use_abc else ""
        return f"{super().__repr__()[:-1]}{abc})"

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)
        batch.fire2_dt.masked_fill_(mask, self.dt0)
        batch.fire2_alpha.masked_fill_(mask, self.astart)
        batch.velocities.masked_fill_(batch.atom_mask(mask).unsqueeze(-1), 0.0)

    def converged(self, batch: Batch) -> torch.Tensor | None:
        conv = super().converged(batch)
        return None if conv is None else conv & ~batch.fire2_back

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        if self.cell is not None:
            step = inertial_step(batch, mask, self.view, partial(self._with_cell, batch, mask))
            batch.fire2_dt, batch.fire2_alpha, batch.fire2_n, batch.fire2_back = step
            return
        batch.fire2_dt, batch.fire2_alpha, batch.fire2_n, batch.fire2_back = ops.fire2_update(
            batch, mask, batch.fire2_back, batch.fire2_dt, batch.fire2_alpha, batch.fire2_n,
            n_min=self.n_min, finc=self.finc, fdec=self.fdec, dtmax=self.dtmax,
            dtmin=self.dtmin, astart=self.astart, fa=self.fa, maxstep=self.maxstep,
            use_abc=self.use_abc,
        )  # fmt: skip

    def _with_cell(self, batch: Batch, mask: torch.Tensor, *sums: torch.Tensor) -> tuple:
        """FIRE2's decisions on the extended sums, for :func:`~.extended.inertial_step`."""
        a, c, p, s, vmax, *state = formulas.fire2_coefficients(
            mask, batch.step, batch.fire2_back, *sums, batch.fire2_dt, batch.fire2_alpha,
            batch.fire2_n, n_min=self.n_min, finc=self.finc, fdec=self.fdec, dtmax=self.dtmax,
            dtmin=self.dtmin, astart=self.astart, fa=self.fa, maxstep=self.maxstep,
            use_abc=self.use_abc,
        )  # fmt: skip
        return (a, c, p, s, vmax if self.use_abc else None, *state)

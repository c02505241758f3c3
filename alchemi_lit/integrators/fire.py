"""FIRE structure optimizer (Bitzek et al., PRL 97, 170201, 2006), batched.

``mode="ase"`` reproduces ``ase.optimize.FIRE`` step for step: masses ignored,
power ``P = v·F`` and the mixing norms taken over the whole system, the step
``dr = dt v`` scaled down when its norm over *all* atoms exceeds ``maxstep``, no
velocity mixing on the very first step.  ``mode="mass_weighted"`` integrates
``v += dt F/m`` instead and clamps each atom's displacement to ``maxstep`` on its
own, which behaves better for systems mixing light and heavy atoms.

Defaults equal ASE's (``dt = 0.1`` and ``dtmax = 1.0`` ASE time units, here given
in fs).  State per system: ``fire_dt``, ``fire_alpha``, ``fire_n`` (steps since the
last uphill reset); velocities live in ``batch.velocities``.  The update is
:func:`~.ops.fire_update`; its decisions :func:`~.formulas.fire_coefficients`.

With ``cell=`` (``mode="ase"`` only) the same decisions drive ASE's FIRE on a cell filter
(:mod:`.cell`): the three cell rows count as atoms in the power, the mixing norms and
the step length, and convergence is on the filter's forces.  That step runs in torch
(:func:`~.extended.inertial_step`); the positions-only step keeps its compiled kernel.
With ``band=NEB(...)`` it is ASE's FIRE on ``NEB``: the band is the system (:mod:`.neb`).
"""

from __future__ import annotations

import math
from functools import partial
from typing import ClassVar, Literal

import torch

from ..core.errors import ConfigError
from ..core.state import Batch
from ..core.units import fs
from . import formulas, ops
from .base import FieldSpec
from .cell import CellFilter
from .convergence import Criterion
from .extended import CellOptimizer, inertial_fields, inertial_step
from .neb import NEB, as_band
from .params import TIME_STEP, check_count, check_param, check_range

#: ASE's FIRE defaults expressed in femtoseconds.
ASE_FIRE_DT_FS = 0.1 / fs
ASE_FIRE_DTMAX_FS = 1.0 / fs


class FIRE(CellOptimizer):
    """Fast inertial relaxation engine; converges when max |F| < ``fmax``.

    Args:
        fmax: force threshold in eV/Å: converged when every atom's force (and with
            ``cell``, every cell row's force) is below it.
        max_steps: the stage's step budget (force calls).
        dt: initial time step in fs (ASE's 0.1 ASE time units).
        dtmax: largest time step in fs (ASE's 1.0 ASE time unit).
        maxstep: largest displacement per step in Å (of the system with ``mode="ase"``,
            of each atom with ``"mass_weighted"``).
        n_min: downhill steps before the time step may grow.
        finc: time-step growth factor on a downhill step, >= 1 (dimensionless).
        fdec: time-step shrink factor on an uphill step, > 0 (dimensionless).
        astart: initial velocity-mixing parameter alpha (dimensionless).
        fa: alpha's decay factor on growing steps (dimensionless).
        mode: ``"ase"`` (ASE's FIRE, masses ignored) or ``"mass_weighted"``.
        cell: relax the cell too: a :class:`CellFilter`, ``"frechet"`` or ``"unit"``
            (ASE's FIRE on ``FrechetCellFilter`` / ``UnitCellFilter``); None: positions.
        criterion: convergence criterion instead of ``ForceMax(fmax)``.
        band: relax nudged elastic bands (:class:`~.neb.NEB`; ``mode="ase"``).
    """

    fields: ClassVar[dict[str, FieldSpec]] = {
        "fire_dt": FieldSpec("system", fill=float("nan")),
        "fire_alpha": FieldSpec("system", fill=float("nan")),
        "fire_n": FieldSpec("system", dtype="int64", fill=0),
    }

    def __init__(
        self,
        fmax: float = 0.05,
        max_steps: int = 1000,
        dt: float = ASE_FIRE_DT_FS,
        dtmax: float = ASE_FIRE_DTMAX_FS,
        maxstep: float = 0.2,
        n_min: int = 5,
        finc: float = 1.1,
        fdec: float = 0.5,
        astart: float = 0.1,
        fa: float = 0.99,
        mode: Literal["ase", "mass_weighted"] = "ase",
        cell: CellFilter | str | None = None,
        criterion: Criterion | None = None,
        band: NEB | None = None,
    ) -> None:
        super().__init__(fmax, max_steps, maxstep, cell, criterion, as_band(band))
        name = type(self).__name__
        self.fields.update(inertial_fields(self.view))
        self.dt0 = check_param("dt", name, dt, unit="fs", usual=TIME_STEP) * fs
        self.dtmax = check_param("dtmax", name, dtmax, unit="fs") * fs
        self.finc = check_range(name, "finc", finc, 1.0, math.inf)
        self.fdec = check_param("fdec", name, fdec)
        self.astart = check_param("astart", name, astart)
        self.fa = check_param("fa", name, fa)
        self.n_min = check_count(name, "n_min", n_min)
        if mode not in ("ase", "mass_weighted"):
            raise ValueError(f"{name}: mode must be 'ase' or 'mass_weighted', got {mode!r}")
        if mode != "ase" and (self.cell or self.band) is not None:
            what = "cell=" if self.cell is not None else "band="
            raise ConfigError(f"{name}: {what} needs mode='ase' (ASE's FIRE), got mode={mode!r}")
        self.mode = mode

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        mask = self.entering(batch, mask)
        super().init_systems(batch, mask)
        batch.fire_dt.masked_fill_(mask, self.dt0)
        batch.fire_alpha.masked_fill_(mask, self.astart)
        batch.velocities.masked_fill_(batch.atom_mask(mask).unsqueeze(-1), 0.0)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        if self.cell is not None or self.band is not None:
            step = inertial_step(batch, mask, self.view, partial(self._with_cell, batch, mask))
            batch.fire_dt, batch.fire_alpha, batch.fire_n = step
            return
        batch.fire_dt, batch.fire_alpha, batch.fire_n = ops.fire_update(
            batch, mask, batch.fire_dt, batch.fire_alpha, batch.fire_n, n_min=self.n_min,
            finc=self.finc, fdec=self.fdec, dtmax=self.dtmax, astart=self.astart, fa=self.fa,
            maxstep=self.maxstep, whole_step=self.mode == "ase",
        )  # fmt: skip

    def _with_cell(self, batch: Batch, mask: torch.Tensor, *sums: torch.Tensor) -> tuple:
        """FIRE's decisions on the extended sums, for :func:`~.extended.inertial_step`."""
        a, c, s, *state = formulas.fire_coefficients(
            mask, batch.step, *sums, batch.fire_dt, batch.fire_alpha, batch.fire_n,
            n_min=self.n_min, finc=self.finc, fdec=self.fdec, dtmax=self.dtmax,
            astart=self.astart, fa=self.fa, maxstep=self.maxstep, whole_step=True,
        )  # fmt: skip
        return (a, c, None, s, None, *state)

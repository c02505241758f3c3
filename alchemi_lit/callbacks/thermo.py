"""ThermoMonitor: per-system temperature and energies, recorded in memory.

Why: checking an MD run (is energy conserved? did the thermostat reach its target?)
needs per-system time series, but the step loop must not wait on the host.  The
monitor copies four ``[B]`` tensors to the host every ``every`` steps and does
nothing in between.  No pandas: :meth:`ThermoMonitor.series` returns NumPy arrays.

A record at loop step ``s`` (hook ``BEFORE_STEP``, so step 0 is the initial state)
holds the state of every system inside a stage after ``s`` loop steps.  With
``final=True`` each system also gets a record of the state it left the plan in
(written at the bookkeeping that sees it finish), so a series ends at the final
step even when that is not a multiple of ``every``.

``steps`` in a series are the system's own step count (``batch.total_steps``,
which equals the loop step for systems present from the start); ``loop_step`` is
the loop step of the record.

Two temperatures, labelled: ``T`` counts 3 degrees of freedom per free atom (3N, as
ASE's ``get_temperature``): it is what every thermostat here holds at its target.
``T_internal`` is the kinetic energy about the centre of mass over 3N - 3: where the
total momentum is conserved (Nosé-Hoover chains, Bussi, Berendsen, velocity Verlet; not
Langevin), the momentum is 3 frozen degrees of freedom and that is the physical
temperature, ``T N/(N - 1)`` at zero total momentum (60 K reads 61.9 K at 32 atoms;
the same as ``T`` at thousands).  For a system with fixed atoms it equals ``T``.

Where the loop computes the stress -- for every system, when a stage needs it (a
barostat, a cell filter) or with ``Simulator(stress=True)`` -- records hold the
pressure ``P`` (GPa, with the ideal-gas term:
:func:`~alchemi_lit.integrators.barostat.instantaneous_pressure`); else it is NaN.  The
volume ``V`` (Å^3) is NaN only for systems without a 3-D cell.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core.state import Batch
from ..core.units import GPa, kB
from ..engine.hooks import Callback, StepContext
from ..integrators.barostat import instantaneous_pressure

_INT_KEYS = ("system_id", "steps", "loop_step")
_FLOAT_KEYS = ("T", "E_kin", "E_pot", "P", "V", "T_internal")


class ThermoMonitor(Callback):
    """Record T, kinetic, potential and total energy per system, volume, and pressure
    where the stress is computed (see module docstring).

    Args:
        every: loop steps between two records (>= 1).
        final: also record each system's state when it finishes the plan.

    After the run, ``monitor.series(system_id)`` gives ``{"steps", "loop_step", "T",
    "T_internal", "E_kin", "E_pot", "E_tot", "P", "V"}`` as NumPy arrays in time order
    (``T``: 3N degrees of freedom, what thermostats hold at their target;
    ``T_internal``: 3N - 3, about the centre of mass -- see the module docstring);
    ``monitor.system_ids`` lists the systems recorded.  Units: K, eV, GPa and Å^3.  The
    history is reset at each run start, except in a run resumed from a checkpoint: it
    goes on from the records the checkpoint holds.
    """

    def __init__(self, every: int = 10, final: bool = True) -> None:
        super().__init__(every)
        self.final = bool(final)
        self._chunks: list[dict[str, np.ndarray]] = []
        self._flat: dict[str, np.ndarray] | None = None
        self._restored = False  # loaded from a checkpoint: the run start keeps the records

    # ---------------------------------------------------------------- hooks
    def on_run_start(self, ctx: StepContext) -> None:
        if not self._restored:  # a resumed run goes on from the checkpoint's records
            self._chunks = []
            self._flat = None
        self._restored = False

    def before_step(self, ctx: StepContext) -> None:
        b = ctx.batch
        if b.num_systems:
            status = b.status
            self._record(ctx, (status >= 0) & (status != ctx.state.get("exit_code", -1)))

    def on_converge(self, ctx: StepContext) -> None:
        b = ctx.batch
        if self.final and ctx.exited is not None and b.num_systems:
            self._record(ctx, ctx.exited & (b.status == ctx.state.get("exit_code", -1)))

    def _record(self, ctx: StepContext, rows: torch.Tensor) -> None:
        b = ctx.batch
        idx = rows.nonzero().flatten()  # host sync, at our every only
        if idx.numel() == 0:
            return
        ints = torch.stack([b.system_id[idx], b.total_steps[idx]]).cpu().numpy()
        ek = b.kinetic_energy()[idx]
        p = instantaneous_pressure(b)[idx] / GPa if stress_computed(ctx) else ek * float("nan")
        v = torch.where(b.volume > 1e-12, b.volume, float("nan"))[idx]
        t, t_internal = b.temperature()[idx], internal_temperature(b)[idx]
        floats = torch.stack([t, ek, b.energy[idx], p, v, t_internal]).cpu().numpy()
        chunk = {
            "system_id": ints[0],
            "steps": ints[1],
            "loop_step": np.full(len(idx), ctx.step, dtype=np.int64),
        }
        chunk.update(zip(_FLOAT_KEYS, floats))
        self._chunks.append(chunk)
        self._flat = None

    # ---------------------------------------------------------------- results
    def _all(self) -> dict[str, np.ndarray]:
        if self._flat is None:
            if self._chunks:
                self._flat = {
                    k: np.concatenate([c[k] for c in self._chunks]) for k in self._chunks[0]
                }
            else:
                self._flat = {k: np.zeros(0, dtype=np.int64) for k in _INT_KEYS}
                self._flat.update({k: np.zeros(0) for k in _FLOAT_KEYS})
            for k in ("P", "V", "T_internal"):  # (a checkpoint's from before they were kept)
                self._flat.setdefault(k, np.full(len(self._flat["T"]), np.nan))
        return self._flat

    @property
    def system_ids(self) -> np.ndarray:
        """Sorted ids of the systems with at least one record."""
        return np.unique(self._all()["system_id"])

    def records(self) -> dict[str, np.ndarray]:
        """Every record of every system, flat, in recording order (plus ``E_tot``)."""
        flat = dict(self._all())
        flat["E_tot"] = flat["E_kin"] + flat["E_pot"]
        return flat

    def series(self, system_id: int) -> dict[str, np.ndarray]:
        """Time series of one system: steps, loop_step, T and T_internal (K), E_kin, E_pot,
        E_tot (eV), P (GPa), V (Å^3)."""
        flat = self._all()
        sel = flat["system_id"] == int(system_id)
        if not sel.any():
            raise KeyError(
                f"ThermoMonitor has no record of system {system_id}; recorded systems: "
                f"{self.system_ids[:20].tolist()}{' ...' if len(self.system_ids) > 20 else ''}"
            )
        out = {k: flat[k][sel] for k in ("steps", "loop_step", *_FLOAT_KEYS)}
        out["E_tot"] = out["E_kin"] + out["E_pot"]
        return out

    def state_dict(self) -> dict[str, Any]:
        # tensors, not NumPy arrays: checkpoints load with torch.load(weights_only=True)
        return {"records": {k: torch.from_numpy(v.copy()) for k, v in self._all().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        records = state.get("records")
        self._chunks = [] if records is None else [{k: np.asarray(v) for k, v in records.items()}]
        self._flat = None
        self._restored = True


def internal_temperature(batch: Batch) -> torch.Tensor:
    """``[B]`` K: the kinetic energy about each system's centre of mass over ``3N - 3``
    degrees of freedom (N free atoms); ``batch.temperature()`` (3N) where a system has
    fixed atoms, whose momentum nothing conserves."""
    v, m, free = batch.velocities, batch.masses, ~batch.fixed
    momentum = batch.segments.sum(torch.where(free[:, None], m[:, None] * v, 0.0))
    mass = batch.segments.sum(torch.where(free, m, 0.0)).clamp_min(1e-30)
    drift = 0.5 * (momentum * momentum).sum(-1) / mass
    dof = batch.degrees_of_freedom()
    inner = 2.0 * (batch.kinetic_energy(free) - drift) / ((dof - 3.0).clamp_min(1.0) * kB)
    anchored = dof < 3.0 * batch.n_atoms.to(dof.dtype)
    return torch.where(anchored, batch.temperature(), inner)


def stress_computed(ctx: StepContext) -> bool:
    """Whether the loop computes the stress (for every system of the batch): a stage
    needs it (a barostat, a cell filter), or ``Simulator(stress=True)``."""
    if getattr(ctx.simulator, "stress", None) is True:
        return True
    return any(getattr(stage, "requires_stress", False) for stage in ctx.stages)

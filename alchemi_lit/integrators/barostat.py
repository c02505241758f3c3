"""What the NPT integrators (:class:`~.mtk.MTKNPT`, :class:`~.crescale.CRescale`,
:class:`~.npt_langevin.NPTLangevin`) share: the external pressure, the instantaneous
pressure of a system, the force on its cell, and moving a cell with its atoms.

Units and signs -- written down here once.  The model's stress is ASE's,
``sigma = (1/V) dE/d(strain)`` in eV/Å^3, positive under tension.  The instantaneous
pressure tensor of a system is ASE's ``-atoms.get_stress(include_ideal_gas=True)``::

    P_int = -sym(sigma) + K / V,     K = sum_i m_i v_i (x) v_i,     P = tr(P_int) / 3

(K is twice the kinetic-energy tensor).  The external pressure is given in GPa
(``pressure_gpa``) or bar (``pressure_bar``), held in eV/Å^3 (``units.GPa``, ``units.bar``)
and compresses when positive; ``P`` is what a barostat holds it to on average.  Times
are in fs at the interface and in ASE's unit inside, temperatures in K.

Cells are rows, as in ASE: a deformation ``M`` moves positions and cell as ``r @ M`` and
``h @ M``, so fractional coordinates stay fixed (the neighbour list rebuilds a system
whose cell changed).  Only systems periodic in x, y and z and without fixed atoms are
accepted (as ASE's MTK: how a fixed atom should follow a fluctuating cell is ambiguous).
Barostat variables are per-system batch fields; parameters may be per system (lists
indexed by ``system_id``).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..core.errors import ConfigError, row_names
from ..core.schedule import bind_steps
from ..core.state import Batch
from ..core.tensor_ops import host_reads_free, may_be_set, rows_times, small_matmul
from ..core.units import GPa, kB
from . import ops
from .constrain import refuse_holonomic
from .md import MDIntegrator, describe
from .params import Param, check_pressure


def external_pressure(owner: str, pressure_gpa: Param | None, pressure_bar: Param | None) -> Param:
    """The external pressure in eV/Å^3 from one of ``pressure_gpa``/``pressure_bar``
    (0 when neither is given; a number or one per ``system_id``): the checks and
    :class:`UnitWarning` rules cell filters share (:func:`~.params.check_pressure`)."""
    return check_pressure(owner, pressure_gpa=pressure_gpa, pressure_bar=pressure_bar)


class NPTIntegrator(MDIntegrator):
    """Base of the NPT integrators: a temperature (K; 0 K as for every thermostat:
    :class:`~.md.MDIntegrator`), an external pressure
    (:func:`external_pressure`), isotropic or full-cell fluctuations; the stress is
    computed in every step (``requires_stress``)."""

    requires_stress: ClassVar[bool] = True
    #: callbacks report pressure and volume for the systems of a barostat's stage
    barostat: ClassVar[bool] = True

    def __init__(
        self,
        dt: Param,
        steps: int,
        temperature: Param,
        pressure_gpa: Param | None,
        pressure_bar: Param | None,
        isotropic: bool,
    ) -> None:
        owner = type(self).__name__
        super().__init__(dt, steps, temperature)
        self.pressure_gpa, self.pressure_bar = pressure_gpa, pressure_bar
        self.pressure = bind_steps(external_pressure(owner, pressure_gpa, pressure_bar), steps)
        if not isinstance(isotropic, bool):
            raise ConfigError(f"{owner}: isotropic must be true or false, got {isotropic!r}")
        self.isotropic = isotropic

    def __repr__(self) -> str:
        p = self.pressure
        p = p / GPa if isinstance(p, float) else describe(p * (1 / GPa))
        kind = "isotropic" if self.isotropic else "full cell"
        return f"{type(self).__name__}(dt={self.dt_fs}, P={p} GPa, {kind}, steps={self.steps})"

    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        self.refuse(batch, torch.ones_like(batch.pbc[:, 0]))  # before any model call
        super().setup(batch, seed, prefix)

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        # arrivals from another rank are checked here (on CPU, where reading is free)
        if host_reads_free(mask) and may_be_set(mask):
            self.refuse(batch, mask)
        super().init_systems(batch, mask)

    def refuse(self, batch: Batch, mask: torch.Tensor) -> None:
        """A :class:`ConfigError` naming the systems of ``mask`` this stage cannot take."""
        fixed = ops.system_sum(batch, batch.fixed.to(batch.dtype)) > 0
        for bad, why in (
            (~batch.pbc.all(-1) | ~(batch.volume > 1e-12), "no cell periodic in x, y and z"),
            (fixed, "fixed atoms (FixAtoms), which a fluctuating cell cannot honour"),
        ):
            rows = (mask & bad).nonzero().flatten().tolist()
            self._refuse_rows(batch, rows, why)
        for row, names in refuse_holonomic(batch, mask):
            why = f"constraints ({names}), which a fluctuating cell cannot honour"
            self._refuse_rows(batch, [row], why)

    def _refuse_rows(self, batch: Batch, rows: list[int], why: str) -> None:
        """Raise for ``rows`` (none: nothing)."""
        if rows:
            names = row_names(batch, rows)
            raise ConfigError(
                f"{type(self).__name__}: {names}{' ...' if len(rows) > 5 else ''} "
                f"{'has' if len(rows) == 1 else 'have'} {why}; NPT needs a periodic 3-D "
                f"cell and free atoms: remove the constraint, or run them in NVT"
            )

    def kt(self, batch: Batch) -> torch.Tensor:
        """``kT`` per system ``[B]`` (eV)."""
        return kB * per_system(batch, self.temperature)


def per_system(batch: Batch, value: Param) -> torch.Tensor:
    """A parameter (a number, or a tensor indexed by ``system_id``) as a ``[B]`` tensor."""
    ones = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
    return ops.per_system(batch, value) * ones


def momentum_flux(batch: Batch) -> torch.Tensor:
    """``K = sum_i m_i v_i (x) v_i`` per system ``[B, 3, 3]`` (twice the kinetic tensor)."""
    v = batch.velocities
    mv = v * batch.masses[:, None]
    return batch.segments.sum((mv[:, :, None] * v[:, None, :]).reshape(-1, 9)).reshape(-1, 3, 3)


def pressure_tensor(batch: Batch) -> torch.Tensor:
    """The instantaneous pressure tensor ``P_int`` ``[B, 3, 3]`` (eV/Å^3; see module doc)."""
    sigma = batch.stress
    volume = batch.volume[:, None, None]
    return momentum_flux(batch) / volume - 0.5 * (sigma + sigma.transpose(-1, -2))


def instantaneous_pressure(batch: Batch) -> torch.Tensor:
    """``P = -tr(sigma)/3 + 2 E_kin / (3 V)`` per system ``[B]`` (eV/Å^3): ASE's pressure
    with the ideal-gas term; NaN for systems without a 3-D cell."""
    volume = batch.volume
    p = -batch.stress.diagonal(0, -2, -1).sum(-1) / 3.0
    kinetic = 2.0 * batch.kinetic_energy() / (3.0 * volume)
    return torch.where(volume > 1e-12, p + kinetic, torch.full_like(p, float("nan")))


def cell_force(batch: Batch, pressure: Param, isotropic: bool = False) -> torch.Tensor:
    """The force on the cell momentum of MTK and Langevin-Hoover barostats: ``[B, 3, 3]``
    ``V (P_int - P I) + tr(K)/Nf I`` with ``Nf = 3N`` (ASE's count), or its trace ``[B]``
    (an isotropic cell's)."""
    eye = torch.eye(3, dtype=batch.dtype, device=batch.device)
    volume = batch.volume[:, None, None]
    k = momentum_flux(batch)
    nf = 3.0 * batch.n_atoms.to(batch.dtype)
    trace_k = k.diagonal(0, -2, -1).sum(-1)
    p_ext = per_system(batch, pressure)[:, None, None]
    g = volume * (pressure_tensor(batch) - p_ext * eye) + (trace_k / nf)[:, None, None] * eye
    return trace(g) if isotropic else g


def kick_cell(batch: Batch, mask: torch.Tensor, name: str, force: torch.Tensor, dt: Param) -> None:
    """``p += dt force`` for the cell momentum field ``name`` of ``mask``'s systems."""
    step = per_system(batch, dt).view(-1, *[1] * (force.dim() - 1))
    set_system(batch, mask, name, getattr(batch, name) + step * force)


def cell_kinetic_energy(p: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``p_eps²/2W`` ``[B]`` of an isotropic cell momentum ``[B]``, ``|p_g|²/2W`` of a full one."""
    return 0.5 * (p * p if p.dim() == 1 else (p * p).sum((-1, -2))) / w


def chain_masses(kt: torch.Tensor, tau: torch.Tensor, length: int, first: Param) -> torch.Tensor:
    """Nosé-Hoover chain masses ``[B, length]``: ``(first, 1, 1, ...) kT tau²``."""
    q = (kt * tau * tau)[:, None].repeat(1, length)
    q[:, 0] = q[:, 0] * first
    return q


def chain_energy(
    kt: torch.Tensor, dof: Param, eta: torch.Tensor, p_eta: torch.Tensor, q: torch.Tensor
) -> torch.Tensor:  # fmt: skip
    """A chain's energy ``[B]``: ``dof kT eta_0 + kT sum_j>0 eta_j + sum p_j²/2Q_j``."""
    return dof * kt * eta[:, 0] + kt * eta[:, 1:].sum(-1) + (0.5 * p_eta * p_eta / q).sum(-1)


def trace(m: torch.Tensor) -> torch.Tensor:
    return m.diagonal(0, -2, -1).sum(-1)


def exprel(x: torch.Tensor) -> torch.Tensor:
    """``(exp(x) - 1) / x``, 1 at 0 (SciPy's ``exprel``)."""
    zero = x == 0
    return torch.where(zero, torch.ones_like(x), torch.expm1(x) / torch.where(zero, 1.0, x))


def symmetric_function(u: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``U diag(values) U^T`` ``[B, 3, 3]`` from eigenvectors ``u`` and ``values [B, 3]``."""
    return small_matmul(u * values[:, None, :], u.transpose(-1, -2))


def eigen_rates(p: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Eigenvectors ``[B, 3, 3]`` and eigenvalues ``[B, 3]`` of a cell momentum over its
    mass, ``p / W`` (1/time): for an isotropic ``p_eps [B]``, None and three equal rates."""
    if p.dim() == 1:
        return None, (p / w)[:, None].expand(-1, 3)
    values, u = torch.linalg.eigh(p)
    return u, values / w[:, None]


def exact_flow(
    batch: Batch, rows: torch.Tensor, drive: torch.Tensor, rate: torch.Tensor,
    u: torch.Tensor | None, dt: Param,
) -> torch.Tensor:  # fmt: skip
    """The exact solution over ``dt`` of ``x' = x A + drive`` with ``A = U diag(rate) U^T``
    (per system): ``x e^{A dt} + dt drive exprel(A dt)``, for per-atom ``rows`` ``[N, 3]``
    (MTK's position and velocity updates)."""
    step = per_system(batch, dt)
    x = rate * step[:, None]
    e, r = flow_matrix(torch.exp(x), u), flow_matrix(exprel(x), u)
    return times(batch, rows, e) + times(batch, drive, r * step.view(-1, *[1] * (r.dim() - 1)))


def flow_matrix(values: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
    """``U diag(values) U^T`` ``[B, 3, 3]``, or the first value ``[B]`` where ``u`` is None
    (isotropic: three equal values)."""
    return values[:, 0] if u is None else symmetric_function(u, values)


def scaled_cell(cell: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``h @ m`` for a deformation ``m`` ``[B, 3, 3]``, or ``h m`` for a number ``[B]``."""
    return cell * m[:, None, None] if m.dim() == 1 else small_matmul(cell, m)


def times(batch: Batch, rows: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Per-atom rows ``[N, 3]`` times their system's ``m``: a matrix ``[B, 3, 3]``
    (``rows @ m``) or a number ``[B]``."""
    if m.dim() == 1:
        return rows * batch.segments.to_xyz(m)[0]
    return rows_times(rows, m.index_select(0, batch.system_idx))


def set_atoms(batch: Batch, mask: torch.Tensor, **rows: torch.Tensor) -> None:
    """Write per-atom fields (``positions=``, ``velocities=``) for ``mask``'s systems."""
    atoms = batch.atom_mask(mask)[:, None]
    for name, value in rows.items():
        setattr(batch, name, torch.where(atoms, value, getattr(batch, name)))


def set_system(batch: Batch, mask: torch.Tensor, name: str, value: torch.Tensor) -> None:
    """Write a per-system field for ``mask``'s systems (others keep theirs, bit for bit)."""
    old = getattr(batch, name)
    setattr(batch, name, torch.where(mask.view(-1, *([1] * (old.dim() - 1))), value, old))


def deform(batch: Batch, mask: torch.Tensor, m: torch.Tensor) -> None:
    """Cell and positions of ``mask``'s systems times ``m`` (``[B, 3, 3]`` or ``[B]``):
    ASE's ``set_cell(h @ m, scale_atoms=True)``."""
    set_atoms(batch, mask, positions=times(batch, batch.positions, m))
    set_system(batch, mask, "cell", scaled_cell(batch.cell, m))


__all__ = [
    "NPTIntegrator",
    "cell_force",
    "deform",
    "external_pressure",
    "instantaneous_pressure",
    "momentum_flux",
    "pressure_tensor",
]

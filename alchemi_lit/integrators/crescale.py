"""Stochastic cell rescaling (C-rescale) NPT with Bussi's thermostat, batched.

Why: a first-order barostat -- the volume relaxes like Berendsen's, exponentially and
without oscillation, so it is safe far from equilibrium -- that, unlike Berendsen's,
samples the isothermal-isobaric ensemble through a noise term (Bernetti & Bussi,
J. Chem. Phys. 153, 114107 (2020); anisotropic: Del Tatto, Raiteri, Bernetti & Bussi,
Appl. Sci. 12, 1139 (2022)).  It keeps no barostat state, so nothing to migrate.  The
time-reversible scheme of the authors' reference code (``bussilab/crescale``, SimpleMD
with ``baroscalev``), in the variable ``l = sqrt(V)``::

    Bussi rescaling over dt (as :class:`~.bussi.Bussi`); kick dt/2          (pre_update)
    f = -2 l (P0 - P - kT/(2V)),  D = kT beta / (4 taup)
    isotropic:   dl = D/kT f dt + sqrt(2 D dt) xi;   R = ((l + dl)/l)^(2/3)
    anisotropic: l over dt/2 (half of the above);  R = expm(A' dt + b xi' sqrt(dt)),
                 A = -beta/(3 taup) (P0 I - P_int - kT/V I),  b = sqrt(2 beta kT/(3 taup V'))
                 (V' the volume after the half step);  l over dt/2;  R scaled to the new
                 volume, its rotation removed (R R^T's Cholesky factor)
    r <- r R + (v R^-T + v R) dt/2;  h <- h R;  v <- v R^-T
       -- force and stress call --
    kick dt/2                                                                (post_update)

(``'``: traceless parts).  ``P``/``P_int`` use the kinetic energy after the kick
(:mod:`.barostat`).  ``beta`` (``compressibility``) need only be the right order of
magnitude: with ``taup`` it sets how fast the volume relaxes, not what is sampled.
Noise: Bussi's ``PURPOSE_THERMOSTAT`` stream, the cell's ``PURPOSE_BAROSTAT`` (1 or 11
normals per system).  Bussi's thermostat counts 3N degrees of freedom (as ASE) but
conserves the total momentum: a system of N atoms at rest as a whole runs at
``T N/(N - 1)`` (3 % hot at 32 atoms, nothing at thousands).
"""

from __future__ import annotations

import torch

from ..core import random as rng
from ..core.linalg import expm, inverse
from ..core.state import Batch
from ..core.tensor_ops import small_matmul
from ..core.units import GPa, fs
from . import barostat as baro
from . import formulas, ops
from .barostat import NPTIntegrator, per_system
from .noise import noise_source
from .params import Param, Usual, check_param

#: compressibilities (1/GPa): a value per bar given as per GPa is ~1e4 too small
COMPRESSIBILITY = Usual(1e-4, 10.0, (1e4, "{value} 1/bar"), None)


class CRescale(NPTIntegrator):
    """Stochastic cell rescaling NPT with Bussi's velocity rescaling (Bernetti & Bussi 2020).

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        temperature: K; 0 K quenches atoms and cell (a number, or one per system).
        pressure_gpa: external pressure in GPa (0 by default; a number or one per system).
        pressure_bar: the same in bar (give one of the two).
        taut: the thermostat's coupling time in fs (at least 2 dt).
        taup: the barostat's relaxation time in fs (at least 2 dt).
        compressibility: isothermal compressibility in 1/GPa, an estimate (argon ~0.3,
            water 0.45, metals ~0.01): with ``taup`` it sets how fast the volume relaxes.
        isotropic: volume fluctuations only; False: the full cell (no rotations).
        steps: the stage's number of steps.
    """

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        pressure_gpa: Param | None = None,
        pressure_bar: Param | None = None,
        taut: Param = 100.0,
        taup: Param = 1000.0,
        compressibility: Param = 0.1,
        isotropic: bool = True,
        steps: int = 1000,
    ) -> None:
        super().__init__(dt, steps, temperature, pressure_gpa, pressure_bar, isotropic)
        owner = type(self).__name__
        self.taut = self.time_constant("taut", taut) * fs
        self.taup = self.time_constant("taup", taup) * fs
        beta = check_param("compressibility", owner, compressibility, unit="1/GPa",
                           usual=COMPRESSIBILITY)  # fmt: skip
        self.beta = beta / GPa  # Å^3/eV

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        c, kt = ops.bussi_constants(batch, self.dt, self.taut, self.temperature)
        r1, s = ops.bussi_noise(batch, self.seed, noise_source(self))
        alpha = formulas.bussi_alpha(c, kt, batch.degrees_of_freedom(), batch.kinetic_energy(),
                                     r1, s)  # fmt: skip
        baro.set_atoms(batch, mask, velocities=baro.times(batch, batch.velocities, alpha))
        ops.kick(batch, mask, 0.5 * self.dt)
        r = self.deformation(batch)
        r_inv_t = 1.0 / r if self.isotropic else inverse(r).transpose(-1, -2)
        v_in = baro.times(batch, batch.velocities, r)
        v_out = baro.times(batch, batch.velocities, r_inv_t)
        half = per_system(batch, 0.5 * self.dt)[batch.system_idx, None]
        positions = baro.times(batch, batch.positions, r) + (v_in + v_out) * half
        baro.set_atoms(batch, mask, positions=positions, velocities=v_out)
        baro.set_system(batch, mask, "cell", baro.scaled_cell(batch.cell, r))

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.kick(batch, mask, 0.5 * self.dt)

    def deformation(self, batch: Batch) -> torch.Tensor:
        """This step's ``R``: ``[B]`` (isotropic) or ``[B, 3, 3]`` lower triangular."""
        kt, dt = self.kt(batch), per_system(batch, self.dt)
        beta, taup = per_system(batch, self.beta), per_system(batch, self.taup)
        volume = batch.volume
        lam = volume.sqrt()
        p_int = baro.pressure_tensor(batch)
        p0 = per_system(batch, self.pressure)
        diffusion = kt * beta / (4.0 * taup)
        lam_force = -2.0 * lam * (p0 - baro.trace(p_int) / 3.0 - 0.5 * kt / volume)
        drift = beta / (4.0 * taup) * lam_force  # D/kT f, defined at 0 K too
        z = ops.system_normals(batch, self.seed, rng.PURPOSE_BAROSTAT, 1 if self.isotropic else 11)
        if self.isotropic:
            d_lam = drift * dt + torch.sqrt(2.0 * diffusion * dt) * z[:, 0]
            return ((lam + d_lam) / lam) ** (2.0 / 3.0)
        half = drift * 0.5 * dt
        spread = torch.sqrt(diffusion * dt)
        d_lam = half + spread * z[:, 0]
        eye = torch.eye(3, dtype=batch.dtype, device=batch.device)
        b = torch.sqrt(2.0 * beta * kt / (3.0 * taup * (lam + d_lam) ** 2))
        a = (-beta / (3.0 * taup))[:, None, None] * (
            (p0 - kt / volume)[:, None, None] * eye - p_int
        )
        xi = z[:, 2:11].reshape(-1, 3, 3)
        step = traceless(a) * dt[:, None, None] + (b * dt.sqrt())[:, None, None] * traceless(xi)
        r = expm(step)
        r = torch.linalg.cholesky(small_matmul(r, r.transpose(-1, -2)))  # without rotation
        d_lam = d_lam + half + spread * z[:, 1]
        return r * (((lam + d_lam) / lam) ** (2.0 / 3.0))[:, None, None]


def traceless(m: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(3, dtype=m.dtype, device=m.device)
    return m - (baro.trace(m) / 3.0)[:, None, None] * eye

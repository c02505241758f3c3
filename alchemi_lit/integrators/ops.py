"""The per-atom steps integrators are made of -- kick, drift, Ornstein-Uhlenbeck, FIRE's
mixed Euler step, keyed noise, velocity initialisation -- written once, in torch.

Every operation acts on the free atoms of the systems in ``mask`` (``[B]`` bool, the
systems of the calling stage) and leaves every other atom bit for bit untouched, so
several stages can share a batch.  Parameters are what integrators hold: a Python number
or a per-system tensor indexed by ``system_id`` (:func:`per_system`); times in ASE's
unit (``alchemi_lit.core.units.fs`` per fs), temperatures in K.

The operations marked *primitive* (:class:`~alchemi_lit.core.backends.Primitive`) may run a
faster implementation a backend registered for their inputs: on CPU the numba kernels
of :mod:`alchemi_lit.kernels` run each as one compiled loop.  The torch code here is the
reference they are held to; it runs on accelerators, with autograd, under
``torch.compile``, and on CPU with ``ALCHEMI_LIT_CPU_KERNELS=0``.  An integrator calls
these functions and never names a backend.  Per-system formulas (FIRE's decisions,
Bussi's factor, the chain) live in :mod:`.formulas`, shared with the kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..core import random as rng
from ..core.backends import primitive
from ..core.schedule import Ramp
from ..core.state import Batch
from ..core.tensor_ops import all_set, may_be_set, on_device
from ..core.units import kB
from . import formulas
from .noise import NoiseStream, noise_keys, noise_source, normals
from .params import Param, Rows


# ------------------------------------------------------------------ selection
def atom_mask(batch: Batch, mask: torch.Tensor) -> torch.Tensor:
    """Atoms ``[N]`` of ``mask``'s systems that are free to move (no ``FixAtoms``)."""
    return batch.atom_mask(mask) & ~batch.fixed


def moving_atoms(batch: Batch, mask: torch.Tensor) -> torch.Tensor | None:
    """``[N, 1]`` mask of the atoms an update moves (for :func:`masked`), or None when it
    moves every atom: known only on CPU, where checking is free (an update of the whole
    batch then needs no ``torch.where``); on an accelerator the mask is always built."""
    if all_set(mask) and not batch.may_have_fixed_atoms():
        return None
    return atom_mask(batch, mask).unsqueeze(-1)


def masked(moving: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` for the ``moving`` atoms (:func:`moving_atoms`, or an ``[N]`` mask), ``old``
    elsewhere."""
    if moving is None:
        return new
    return torch.where(moving.unsqueeze(-1) if moving.dim() == 1 else moving, new, old)


def per_system(batch: Batch, value: Param | Rows) -> Param:
    """A parameter as a Python number, or a ``[B]`` tensor gathered by ``system_id`` (a
    :class:`~alchemi_lit.core.schedule.Ramp`: its value at each system's step in the stage;
    a :class:`~.params.Rows` parameter: its batch field as it is)."""
    if isinstance(value, Ramp):
        return value.values(batch)
    if isinstance(value, Rows):
        return getattr(batch, value.field)
    if isinstance(value, torch.Tensor):
        return on_device(value, batch.device, batch.dtype)[batch.system_id]
    return value


def per_xyz(batch: Batch, value: Param) -> Param:
    """A ``[B]`` value (:func:`per_system`) as a contiguous ``[N, 3]`` tensor, elementwise
    with positions and forces; numbers pass through."""
    if isinstance(value, torch.Tensor) and value.dim():
        return batch.segments.to_xyz(value)[0]
    return value


def system_sum(batch: Batch, per_atom: torch.Tensor) -> torch.Tensor:
    """Sum per-atom values ``[N]`` (or ``[N, k]``) into systems ``[B]`` (``[B, k]``)."""
    return batch.segments.sum(per_atom)


# ------------------------------------------------------------------ kicks and drifts
def kick_factors(batch: Batch, dt: Param) -> torch.Tensor:
    """``dt / m`` per atom component ``[N, 3]`` (``dt`` a number or ``[B]``), kept for
    the run when ``dt`` is a number."""
    seg = batch.segments
    if isinstance(dt, torch.Tensor):
        return per_xyz(batch, dt) / seg.atom_xyz(batch.masses)
    return seg.derived_xyz(batch.masses, ("dt/m", dt), lambda m: dt / m)


def _kick(batch: Batch, moving: torch.Tensor | None, dt: Param) -> None:
    v = torch.addcmul(batch.velocities, kick_factors(batch, dt), batch.forces)
    batch.velocities = masked(moving, v, batch.velocities)


def _drift(batch: Batch, moving: torch.Tensor | None, dt: Param) -> None:
    if isinstance(dt, torch.Tensor):
        r = torch.addcmul(batch.positions, per_xyz(batch, dt), batch.velocities)
    else:
        r = torch.add(batch.positions, batch.velocities, alpha=dt)
    batch.positions = masked(moving, r, batch.positions)


@primitive
def kick(batch: Batch, mask: torch.Tensor, dt: Param) -> None:
    """*Primitive.*  ``v += dt F / m``: a velocity-Verlet step closes with ``dt / 2``."""
    _kick(batch, moving_atoms(batch, mask), per_system(batch, dt))


def drift(batch: Batch, mask: torch.Tensor, dt: Param) -> None:
    """``r += dt v``."""
    _drift(batch, moving_atoms(batch, mask), per_system(batch, dt))


@primitive
def kick_drift(
    batch: Batch, mask: torch.Tensor, dt: Param, scale: torch.Tensor | None = None
) -> None:
    """*Primitive.*  The opening of a velocity-Verlet step: velocities scaled by ``scale``
    ``[B]`` (a thermostat's factor, one per batch row; none by default), a kick over
    ``dt / 2``, a drift over ``dt``."""
    moving, dt = moving_atoms(batch, mask), per_system(batch, dt)
    if scale is not None:
        (scale3,) = batch.segments.to_xyz(scale)
        batch.velocities = masked(moving, batch.velocities * scale3, batch.velocities)
    _kick(batch, moving, 0.5 * dt)
    _drift(batch, moving, dt)


# ------------------------------------------------------------------ Langevin
def ou_coefficients(
    batch: Batch, dt: Param, gamma: Param, temperature: Param
) -> tuple[Param, torch.Tensor]:
    """The exact Ornstein-Uhlenbeck update over ``dt`` (a number or ``[B]``):
    ``c1 = exp(-gamma dt)`` per system (a number when every parameter is one) and
    ``c2 = sqrt((1 - c1²) kT / m)`` per atom component ``[N, 3]``."""
    gamma, kt = per_system(batch, gamma), kB * per_system(batch, temperature)
    if isinstance(gamma * dt * kt, torch.Tensor):
        c1 = torch.exp(-gamma * dt * torch.ones_like(batch.energy))
        spread = torch.sqrt((1.0 - c1 * c1) * kt)
        return c1, per_xyz(batch, spread) * batch.segments.atom_xyz(batch.masses).rsqrt()
    c1 = math.exp(-gamma * dt)
    spread = math.sqrt((1.0 - c1 * c1) * kt)
    sigma = batch.segments.derived_xyz(  # kept for the run
        batch.masses, ("sigma", spread), lambda m: spread * m.rsqrt()
    )
    return c1, sigma


def _ou(batch: Batch, moving: torch.Tensor | None, c1: Param, c2: torch.Tensor,
        xi: torch.Tensor) -> None:  # fmt: skip
    v = torch.addcmul(per_xyz(batch, c1) * batch.velocities, c2, xi)
    batch.velocities = masked(moving, v, batch.velocities)


def ornstein_uhlenbeck(
    batch: Batch, mask: torch.Tensor, stream: NoiseStream, dt: Param, gamma: Param,
    temperature: Param, purpose: int = rng.PURPOSE_NOISE,
) -> None:  # fmt: skip
    """``v = c1 v + c2 xi`` (:func:`ou_coefficients`): friction ``gamma`` (1/time) towards
    ``temperature`` over ``dt``, with ``stream``'s keyed normals of ``purpose``."""
    c1, c2 = ou_coefficients(batch, per_system(batch, dt), gamma, temperature)
    _ou(batch, moving_atoms(batch, mask), c1, c2, normals(batch, stream, purpose))


@primitive
def baoab_opening(
    batch: Batch, mask: torch.Tensor, stream: NoiseStream, dt: Param, gamma: Param,
    temperature: Param,
) -> None:  # fmt: skip
    """*Primitive.*  Langevin BAOAB up to the force call: kick ``dt/2``, drift ``dt/2``,
    Ornstein-Uhlenbeck over ``dt`` (noise ``PURPOSE_NOISE``), drift ``dt/2``."""
    moving, dt = moving_atoms(batch, mask), per_system(batch, dt)
    _kick(batch, moving, 0.5 * dt)
    _drift(batch, moving, 0.5 * dt)
    c1, c2 = ou_coefficients(batch, dt, gamma, temperature)
    _ou(batch, moving, c1, c2, normals(batch, stream, rng.PURPOSE_NOISE))
    _drift(batch, moving, 0.5 * dt)


def system_normals(batch: Batch, seed: int, purpose: int, count: int) -> torch.Tensor:
    """``count`` standard normals per system ``[B, count]`` for the current step, keyed
    like the atoms' (:func:`~alchemi_lit.core.random.atom_normals`) with the indices
    ``0 .. ceil(count / 3) - 1`` in place of atom indices: a barostat's noise, which
    depends on nothing outside its system (not even on its number of atoms)."""
    per, b = -(-count // 3), batch.num_systems
    rows = torch.arange(b, device=batch.device).repeat_interleave(per)
    local = torch.arange(per, device=batch.device).repeat(b)
    z = rng.atom_normals(
        seed, batch.system_id, batch.total_steps, rows, local, purpose, batch.dtype
    )  # fmt: skip
    return z.reshape(b, 3 * per)[:, :count]


# ------------------------------------------------------------------ thermostats
def bussi_constants(
    batch: Batch, dt: Param, taut: Param, temperature: Param
) -> tuple[torch.Tensor, torch.Tensor]:
    """``c = exp(-dt / taut)`` and ``kT`` per system ``[B]``."""
    ones = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
    c = torch.exp(-per_system(batch, dt) / per_system(batch, taut) * ones)
    return c, kB * per_system(batch, temperature) * ones


@primitive
def bussi_opening(
    batch: Batch, mask: torch.Tensor, stream: NoiseStream, dt: Param, taut: Param,
    temperature: Param,
) -> None:  # fmt: skip
    """*Primitive.*  Bussi's velocity rescaling (:func:`.formulas.bussi_alpha`, noise
    :func:`bussi_noise`) and then :func:`kick_drift`."""
    c, kt = bussi_constants(batch, dt, taut, temperature)
    ke = batch.kinetic_energy(~batch.fixed if batch.may_have_fixed_atoms() else None)
    r1, s = bussi_noise(batch, stream.seed, noise_source(stream))
    alpha = formulas.bussi_alpha(c, kt, batch.degrees_of_freedom(), ke, r1, s)
    kick_drift.reference(batch, mask, dt, scale=alpha)


def bussi_noise(
    batch: Batch, seed: int, draw: Callable[..., torch.Tensor] = rng.atom_normals
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bussi's ``(R1, S)`` per system ``[B]`` for the current step: of the keyed normals
    ``PURPOSE_THERMOSTAT`` (3 per free atom) ``R1`` is the first free atom's first and
    ``S`` the sum of the squares of all others.  ``draw``: :func:`~alchemi_lit.core.random.
    atom_normals` or a source of the same numbers (:func:`noise_source`)."""
    seg, local = batch.segments, batch.segments.local_index
    z = draw(*noise_keys(batch, seed, rng.PURPOSE_THERMOSTAT))
    removed = batch.system.get("constraint_dof")
    if removed is not None and may_be_set(removed != 0):
        return _bussi_noise_of(batch, z, batch.degrees_of_freedom())
    if not batch.may_have_fixed_atoms():  # the first free atom is each system's first
        r1 = z[:, 0].index_select(0, seg.starts)
        return r1, seg.sum_xyz(z * z) - r1 * r1
    free = ~batch.fixed
    big = torch.iinfo(torch.int64).max
    first = torch.full_like(batch.n_atoms, big).scatter_reduce(
        0, batch.system_idx, torch.where(free, local, big), "amin", include_self=True
    )
    is_first = free & (local == first.index_select(0, batch.system_idx))
    r1 = system_sum(batch, torch.where(is_first, z[:, 0], torch.zeros_like(z[:, 0])))
    sq = z * z
    sq[:, 0] = torch.where(is_first, torch.zeros_like(sq[:, 0]), sq[:, 0])
    s = system_sum(batch, torch.where(free, sq.sum(-1), torch.zeros_like(sq[:, 0])))
    return r1, s


def _bussi_noise_of(batch: Batch, z: torch.Tensor, dof: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Bussi's ``(R1, S)`` when constraints remove degrees of freedom: of the free atoms'
    normals in order (3 per atom), ``R1`` is the first and ``S`` the squares of the next
    ``Nf - 1`` -- a chi-squared of ``Nf - 1`` degrees, as Bussi's formula needs."""
    free = (~batch.fixed).to(torch.int64)
    before = torch.cumsum(free, 0) - free  # free atoms before each atom, batch-wide
    rank = before - before.index_select(0, batch.segments.starts).index_select(0, batch.system_idx)
    component = 3 * rank.unsqueeze(-1) + torch.arange(3, device=batch.device)
    nf = dof.index_select(0, batch.system_idx).unsqueeze(-1)
    counted = (free.unsqueeze(-1) == 1) & (component < nf)
    first = counted & (component == 0)
    r1 = system_sum(batch, torch.where(first, z, 0.0).sum(-1))
    s = system_sum(batch, torch.where(counted & ~first, z * z, 0.0).sum(-1))
    return r1, s


def chain_constants(
    batch: Batch, temperature: Param, tdamp: Param, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Nosé-Hoover chain's ``kT [B]``, ``Nf [B]`` (3 per free atom) and masses
    ``Q [B, length]`` (ASE's: ``Nf kT tdamp²`` for the first, ``kT tdamp²`` after)."""
    ones = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
    kt = kB * per_system(batch, temperature) * ones
    tdamp = per_system(batch, tdamp) * ones
    nf = batch.degrees_of_freedom()
    q = (kt * tdamp * tdamp).unsqueeze(-1).repeat(1, length)
    q[:, 0] = q[:, 0] * nf
    return kt, nf, q.clamp_min(1e-300)


@primitive
def nhc_half_step(
    batch: Batch, mask: torch.Tensor, eta: torch.Tensor, p_eta: torch.Tensor, dt: Param,
    temperature: Param, tdamp: Param, suzuki_yoshida: int = 3, chain_steps: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """*Primitive.*  A Nosé-Hoover chain over ``dt / 2`` (:func:`.formulas.chain_half_step`)
    for ``mask``'s systems: their free atoms' velocities scaled, the new chain positions
    and momenta ``eta``, ``p_eta`` ``[B, M]`` returned (unchanged outside ``mask``)."""
    kt, nf, q = chain_constants(batch, temperature, tdamp, eta.shape[1])
    moving, v = moving_atoms(batch, mask), batch.velocities
    mv2 = 2.0 * batch.kinetic_energy(moving)  # tracked as a number and rescaled (MTK)
    eta, p_eta, scale = formulas.chain_half_step(
        mask, eta, p_eta, q, kt, nf, mv2, 0.5 * per_system(batch, dt),
        weights=formulas.SUZUKI_YOSHIDA[suzuki_yoshida], chain_steps=chain_steps,
    )  # fmt: skip
    (scale3,) = batch.segments.to_xyz(scale)
    batch.velocities = masked(moving, v * scale3, v)
    return eta, p_eta


# ------------------------------------------------------------------ FIRE
def power_sums(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-system ``v.F``, ``F.F`` and ``v.v`` ``[B]``: all the reductions a FIRE step
    needs (the norms of its mixed velocity and step follow from them)."""
    seg, f, v = batch.segments, batch.forces, batch.velocities
    return seg.sum_xyz(v * f), seg.sum(batch.force_sq_norms()), seg.sum_xyz(v * v)


@primitive
def fire_update(
    batch: Batch, mask: torch.Tensor, dt: torch.Tensor, alpha: torch.Tensor, n: torch.Tensor,
    *, n_min: int, finc: float, fdec: float, dtmax: float, astart: float, fa: float,
    maxstep: float, whole_step: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """*Primitive.*  FIRE's mixed Euler step (:func:`.formulas.fire_coefficients` on the
    sums :func:`power_sums`): ``v' = a v + c F``, ``r' = r + s v'`` (``whole_step``: ASE's
    step-length control over the system) or, mass-weighted, ``v' = a v + (c + dt/m) F``
    with each atom's step clamped to ``maxstep``.  Returns the new ``dt, alpha, n``."""
    seg, f, v = batch.segments, batch.forces, batch.velocities
    a, c, s, dt, alpha, n = formulas.fire_coefficients(
        mask, batch.step, *power_sums(batch), dt, alpha, n, n_min=n_min, finc=finc,
        fdec=fdec, dtmax=dtmax, astart=astart, fa=fa, maxstep=maxstep, whole_step=whole_step,
    )  # fmt: skip
    a3, c3, s3 = seg.to_xyz(a, c, s)
    if whole_step:
        v_new = torch.addcmul(a3 * v, c3, f)
        r_new = torch.addcmul(batch.positions, s3, v_new)
    else:  # c = mixing scale, s = the system's dt: v' = a v + (c + dt / m) F
        v_new = a3 * v + (c3 + s3 / seg.atom_xyz(batch.masses)) * f
        dr = s3 * v_new
        norm = dr.norm(dim=-1, keepdim=True)
        dr = torch.where(norm > maxstep, dr * (maxstep / norm.clamp_min(1e-300)), dr)
        r_new = batch.positions + dr
    moving = moving_atoms(batch, mask)
    batch.velocities = masked(moving, v_new, v)
    batch.positions = masked(moving, r_new, batch.positions)
    return dt, alpha, n


@primitive
def fire2_update(
    batch: Batch, mask: torch.Tensor, back: torch.Tensor, dt: torch.Tensor,
    alpha: torch.Tensor, n: torch.Tensor, *, n_min: int, finc: float, fdec: float,
    dtmax: float, dtmin: float, astart: float, fa: float, maxstep: float, use_abc: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """*Primitive.*  FIRE2's step (:func:`.formulas.fire2_coefficients`): ``v' = A v + C F``
    (ABC-FIRE clips each component), ``r' = r + P v + S v'`` -- uphill systems step back
    half a step.  Returns the new ``dt, alpha, n, back``."""
    seg, f, v = batch.segments, batch.forces, batch.velocities
    a_, c_, p_, s_, vmax, *state = formulas.fire2_coefficients(
        mask, batch.step, back, *power_sums(batch), dt, alpha, n, n_min=n_min, finc=finc,
        fdec=fdec, dtmax=dtmax, dtmin=dtmin, astart=astart, fa=fa, maxstep=maxstep,
        use_abc=use_abc,
    )  # fmt: skip
    a3, c3, p3, s3 = seg.to_xyz(a_, c_, p_, s_)
    v_new = torch.addcmul(a3 * v, c3, f)
    if use_abc:
        (vmax3,) = seg.to_xyz(vmax)
        v_new = torch.minimum(torch.maximum(v_new, -vmax3), vmax3)
    r_new = torch.addcmul(torch.addcmul(batch.positions, p3, v), s3, v_new)
    moving = moving_atoms(batch, mask)
    batch.velocities = masked(moving, v_new, v)
    batch.positions = masked(moving, r_new, batch.positions)
    return tuple(state)  # type: ignore[return-value]

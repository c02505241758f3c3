"""The numba kernels as a backend: faster implementations of the integrators' primitives
(:mod:`alchemi_lit.integrators.ops`), of the keyed noise (:func:`alchemi_lit.core.random.
atom_normals`), of the force criterion (:func:`alchemi_lit.integrators.convergence.
largest_force_below`) and of the run sums into atoms and systems
(:func:`alchemi_lit.core.segments.run_sums`), registered with
:mod:`alchemi_lit.core.backends` when it first dispatches.

Each registration takes the inputs :func:`~alchemi_lit.kernels.usable` accepts (kernels
enabled, numba importable, CPU tensors NumPy can view, not inside ``torch.compile``) and
runs one compiled call of :mod:`.dynamics`, :mod:`.fire`, :mod:`.philox` or
:mod:`.reductions` -- the same arithmetic as the torch reference, held to it by
``tests/kernels/test_cpu_kernels.py``.

What a kernel reads besides the batch (``dt / m`` per atom, the noise amplitude, a
thermostat's per-system constants) is kept here between steps (:func:`kept`): gathering
it again after each forward would cost more lookups and conversions than the kernel.  The noise
comes from the integrator's draws ahead (:func:`~alchemi_lit.integrators.noise.
noise_source`), which a kernel reads at each system's own step.  Importing this module
does not import numba: the kernel modules are loaded at their first call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from .. import kernels
from ..core import random as rng
from ..core import segments, system_sums
from ..core.schedule import Ramp
from ..core.state import Batch
from ..core.tensor_ops import identity_key, same_key
from ..integrators import convergence, ops
from ..integrators.formulas import SUZUKI_YOSHIDA
from ..integrators.noise import NoiseStream
from ..integrators.params import Param, Rows

T = TypeVar("T")
BACKEND = "numba"

#: kept constants per kind: a few layouts and parameter sets (several stages, one batch)
KEEP = 4
_kept: dict[str, list[tuple[list[Any], Any]]] = {}


def kept(batch: Batch, name: str, params: Sequence[Any], make: Callable[[], T]) -> T:
    """``make()``, kept under ``name`` while the batch layout (``segments``, ``system_id``),
    its masses and fixed atoms, and ``params`` stay the same (tensors by identity and
    version, numbers by value); the last :data:`KEEP` of each ``name``.  Never kept
    with a :class:`~alchemi_lit.core.schedule.Ramp` among ``params``: its value
    changes every step."""
    if any(isinstance(p, Ramp) for p in params):
        return make()
    atom = batch.atom  # (the stores themselves: a step reads this right after the model)
    if any(isinstance(p, Rows) for p in params):  # a batch field: keyed by its tensor
        params = [getattr(batch, p.field) if isinstance(p, Rows) else p for p in params]
    key = identity_key(
        (batch.segments, batch.system["system_id"], atom["masses"], atom["fixed"], *params)
    )
    entries = _kept.setdefault(name, [])
    for entry_key, value in entries:
        if same_key(entry_key, key):
            return value
    value = make()
    entries.insert(0, (key, value))
    del entries[KEEP:]
    return value


def _per_atom(per_component: torch.Tensor) -> np.ndarray:
    """An ``[N, 3]`` factor that repeats one value per atom as that ``[N]`` array (the
    kernels read one number per atom)."""
    return per_component[:, 0].contiguous().numpy()


def _rows(batch: Batch, value: Param) -> np.ndarray:
    """A parameter (number or per-``system_id`` tensor) as a ``[B]`` array."""
    return kernels.per_system(batch, ops.per_system(batch, value))


def _kick_constants(
    batch: Batch, dt: Param, share: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """``share * dt / m`` per atom ``[N]`` and the fixed-atom mask, kept.  (``share``
    is keyed apart from ``dt``: a per-system ``dt`` tensor scaled by the caller would be
    a new tensor, and so a new key, at every step.)"""

    def make() -> tuple[np.ndarray, np.ndarray]:
        factors = ops.kick_factors(batch, share * ops.per_system(batch, dt))
        return _per_atom(factors), batch.fixed.numpy()

    return kept(batch, "kick", (dt, share), make)


def _moves(batch: Batch, *args: Any, **kwargs: Any) -> bool:
    return kernels.usable(batch.positions, batch.velocities, batch.forces)


@ops.kick.register(BACKEND, lambda batch, *a, **k: kernels.usable(batch.velocities, batch.forces))
def kick(batch: Batch, mask: torch.Tensor, dt: Param) -> None:
    factors, fixed = _kick_constants(batch, dt)
    starts, counts = batch.segments.bounds
    batch.velocities = torch.from_numpy(kernels.load("dynamics").kick(
        batch.velocities.numpy(), batch.forces.numpy(), factors, starts, counts, mask.numpy(),
        fixed,
    ))  # fmt: skip


@ops.kick_drift.register(BACKEND, _moves)
def kick_drift(
    batch: Batch, mask: torch.Tensor, dt: Param, scale: torch.Tensor | None = None
) -> None:
    factors, fixed = _kick_constants(batch, dt, 0.5)
    starts, counts = batch.segments.bounds
    r, v = kernels.load("dynamics").kick_drift(
        batch.positions.numpy(), batch.velocities.numpy(), batch.forces.numpy(), factors,
        _rows(batch, dt), kernels.per_system(batch, 1.0 if scale is None else scale),
        starts, counts, mask.numpy(), fixed,
    )  # fmt: skip
    batch.positions, batch.velocities = torch.from_numpy(r), torch.from_numpy(v)


@ops.baoab_opening.register(BACKEND, _moves)
def baoab_opening(
    batch: Batch, mask: torch.Tensor, stream: NoiseStream, dt: Param, gamma: Param,
    temperature: Param,
) -> None:  # fmt: skip
    def make() -> tuple[np.ndarray, ...]:  # dt / 2m, dt / 2, c1 and the noise amplitude
        step = ops.per_system(batch, dt)
        c1, sigma = ops.ou_coefficients(batch, step, gamma, temperature)
        half_kick = _per_atom(ops.kick_factors(batch, 0.5 * step))
        return half_kick, _rows(batch, 0.5 * dt), kernels.per_system(batch, c1), _per_atom(sigma)

    constants = kept(batch, "baoab", (dt, gamma, temperature), make)
    half_step = kernels.load("dynamics").baoab_first_half
    _noisy_step(batch, mask, stream, rng.PURPOSE_NOISE, half_step, constants)


def _all_dof_free(batch: Batch, *args: Any, **kwargs: Any) -> bool:
    """The kernel counts 3 degrees of freedom per free atom: not for systems whose
    constraints remove some (``constraint_dof``; the torch reference counts those)."""
    removed = batch.system.get("constraint_dof")
    return _moves(batch) and (removed is None or not bool(removed.any()))


@ops.bussi_opening.register(BACKEND, _all_dof_free)
def bussi_opening(
    batch: Batch, mask: torch.Tensor, stream: NoiseStream, dt: Param, taut: Param,
    temperature: Param,
) -> None:  # fmt: skip
    half_kick, _ = _kick_constants(batch, dt, 0.5)
    c, kt = kept(
        batch, "bussi", (dt, taut, temperature),
        lambda: [t.numpy() for t in ops.bussi_constants(batch, dt, taut, temperature)],
    )  # fmt: skip
    constants = (half_kick, _rows(batch, dt), batch.masses.numpy(), c, kt)
    opening = kernels.load("dynamics").bussi_kick_drift
    _noisy_step(batch, mask, stream, rng.PURPOSE_THERMOSTAT, opening, constants)


@ops.nhc_half_step.register(BACKEND, lambda batch, *a, **k: kernels.usable(batch.velocities))
def nhc_half_step(
    batch: Batch, mask: torch.Tensor, eta: torch.Tensor, p_eta: torch.Tensor, dt: Param,
    temperature: Param, tdamp: Param, suzuki_yoshida: int = 3, chain_steps: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    length = eta.shape[1]
    kt, nf, q = kept(  # (the same for every half step)
        batch, "chain", (temperature, tdamp, length),
        lambda: [t.numpy() for t in ops.chain_constants(batch, temperature, tdamp, length)],
    )  # fmt: skip
    starts, counts = batch.segments.bounds
    v, eta, p = kernels.load("dynamics").nhc_half_step(
        batch.velocities.numpy(), batch.masses.numpy(), starts, counts, mask.numpy(),
        batch.fixed.numpy(), eta.numpy(), p_eta.numpy(), q, kt, nf,
        kernels.per_system(batch, 0.5 * ops.per_system(batch, dt)),
        SUZUKI_YOSHIDA[suzuki_yoshida], chain_steps,
    )  # fmt: skip
    batch.velocities = torch.from_numpy(v)
    return torch.from_numpy(eta), torch.from_numpy(p)


@ops.fire_update.register(
    BACKEND, lambda batch, mask, dt, *a, **k: _moves(batch) and kernels.usable(dt)
)
def fire_update(
    batch: Batch, mask: torch.Tensor, dt: torch.Tensor, alpha: torch.Tensor, n: torch.Tensor,
    *, n_min: int, finc: float, fdec: float, dtmax: float, astart: float, fa: float,
    maxstep: float, whole_step: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    starts, counts = batch.segments.bounds
    out = kernels.load("fire").fire_update(
        batch.positions.numpy(), batch.velocities.numpy(), batch.forces.numpy(),
        batch.masses.numpy(), starts, counts, batch.fixed.numpy(), mask.numpy(),
        batch.step.numpy(), dt.numpy(), alpha.numpy(), n.numpy(), n_min, finc, fdec, dtmax,
        astart, fa, maxstep, whole_step,
    )  # fmt: skip
    batch.positions, batch.velocities, dt, alpha, n = map(torch.from_numpy, out)
    return dt, alpha, n


@ops.fire2_update.register(
    BACKEND, lambda batch, mask, back, dt, *a, **k: _moves(batch) and kernels.usable(dt)
)
def fire2_update(
    batch: Batch, mask: torch.Tensor, back: torch.Tensor, dt: torch.Tensor,
    alpha: torch.Tensor, n: torch.Tensor, *, n_min: int, finc: float, fdec: float,
    dtmax: float, dtmin: float, astart: float, fa: float, maxstep: float, use_abc: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    starts, counts = batch.segments.bounds
    out = kernels.load("fire").fire2_update(
        batch.positions.numpy(), batch.velocities.numpy(), batch.forces.numpy(),
        starts, counts, batch.fixed.numpy(), mask.numpy(), batch.step.numpy(),
        back.numpy(), dt.numpy(), alpha.numpy(), n.numpy(), n_min, finc, fdec, dtmax, dtmin,
        astart, fa, maxstep, use_abc,
    )  # fmt: skip
    batch.positions, batch.velocities, *state = map(torch.from_numpy, out)
    return tuple(state)  # type: ignore[return-value]


@rng.atom_normals.register(
    BACKEND, lambda seed, sid, step, idx, local, *a, **k: kernels.usable(sid, step, idx, local)
)
def atom_normals(
    seed: int, system_id: torch.Tensor, step: torch.Tensor, system_idx: torch.Tensor,
    local_index: torch.Tensor, purpose: int, dtype: torch.dtype, ahead: int = 1,
) -> torch.Tensor:  # fmt: skip
    """Philox and the uniforms in one compiled loop, Box-Muller in torch."""
    mask32 = rng._MASK32
    uniforms = kernels.load("philox").atom_uniforms(
        seed & mask32, (seed >> 32) & mask32, system_id.numpy(), step.numpy(),
        system_idx.numpy(), local_index.numpy(), purpose, 2 * math.pi, ahead,
    )  # fmt: skip
    return rng.box_muller_block(torch.from_numpy(uniforms), dtype)


def _run_sums_take(values: torch.Tensor, lengths: torch.Tensor) -> bool:
    return (
        values.is_floating_point() and values.dim() in (1, 2) and values.shape[0] > 0
        and kernels.usable(values, lengths)
    )  # fmt: skip


@segments.run_sums.register(BACKEND, _run_sums_take)
def run_sums(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    rows = values.numpy().reshape(len(values), -1)
    out = np.zeros((len(lengths), rows.shape[1]), dtype=rows.dtype)
    kernels.load("reductions").run_sums(rows, lengths.numpy(), out)
    return torch.from_numpy(out).reshape(len(lengths), *values.shape[1:])


def _kinetic_take(v: torch.Tensor, m: torch.Tensor, seg: Any, *others: Any) -> bool:
    """Kinetic energy and temperature: the tensors among ``others`` (masks, counts) too."""
    return v.shape[0] > 0 and kernels.usable(v, m, *(t for t in others if t is not None))


@system_sums.kinetic_energy.register(BACKEND, _kinetic_take)
def kinetic_energy(velocities: torch.Tensor, masses: torch.Tensor, seg: Any,
                   atoms: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    v = velocities.numpy()
    mask = np.zeros(0, dtype=np.bool_) if atoms is None else atoms.reshape(-1).numpy()
    out = np.zeros(seg.num_systems, dtype=v.dtype)
    return torch.from_numpy(kernels.load("reductions").kinetic_sums(
        v, masses.to(velocities.dtype).numpy(), seg.bounds[1], mask, out))  # fmt: skip


@system_sums.temperature.register(BACKEND, _kinetic_take)
def temperature(
    velocities: torch.Tensor, masses: torch.Tensor, seg: Any, n_atoms: torch.Tensor,
    fixed: torch.Tensor | None, removed: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    v = velocities.numpy()
    dtype = v.dtype
    out = np.zeros(seg.num_systems, dtype=dtype)
    free = np.zeros(0, dtype=np.bool_) if fixed is None else fixed.numpy()
    less = np.zeros(len(out), dtype) if removed is None else removed.to(velocities.dtype).numpy()
    consts = np.array([system_sums.kB, 1.0, 3.0], dtype=dtype)
    kernels.load("reductions").temperatures(
        v, masses.to(velocities.dtype).numpy(), seg.bounds[1],
        n_atoms.to(velocities.dtype).numpy(), free, less, consts, out,
    )  # fmt: skip
    return torch.from_numpy(out)


@system_sums.cell_volume.register(BACKEND, lambda cell: cell.shape[0] > 0 and kernels.usable(cell))
def cell_volume(cell: torch.Tensor) -> torch.Tensor:
    c = cell.numpy()
    return torch.from_numpy(kernels.load("reductions").cell_volumes(c, np.empty(len(c), c.dtype)))


@convergence.largest_force_below.register(BACKEND, lambda batch, fmax: kernels.usable(batch.forces))
def largest_force_below(batch: Batch, fmax: float) -> torch.Tensor:
    starts, counts = batch.segments.bounds
    below = kernels.load("reductions").max_sq_norm_below
    return torch.from_numpy(below(batch.forces.numpy(), starts, counts, fmax**2))


def _noisy_step(
    batch: Batch, mask: torch.Tensor, stream: NoiseStream, purpose: int,
    kernel: Callable[..., Any], constants: Sequence[np.ndarray],
) -> None:  # fmt: skip
    """New positions and velocities from a kernel that also reads this step's keyed noise:
    ``kernel(r, v, f, *constants, noise, noise_base, step, noise_steps, starts, counts,
    mask, fixed)`` returns ``(r, v, covered)``; run on the draw covering the step, and
    again on a fresh draw if a system's step lies outside it (``covered`` False)."""
    starts, counts = batch.segments.bounds
    r, v, f = batch.positions.numpy(), batch.velocities.numpy(), batch.forces.numpy()
    for fresh in (False, True):
        noise = _noise_window(batch, stream, purpose, fresh)
        r_new, v_new, covered = kernel(
            r, v, f, *constants, noise.values.numpy(), noise.base, batch.total_steps.numpy(),
            noise.steps, starts, counts, mask.numpy(), batch.fixed.numpy(),
        )  # fmt: skip
        if covered:
            break
    batch.positions, batch.velocities = torch.from_numpy(r_new), torch.from_numpy(v_new)


def _noise_window(
    batch: Batch, stream: NoiseStream, purpose: int, fresh: bool
) -> rng.NormalsWindow:
    """The stream's draw that covers this step and maybe the next few (a kernel picks each
    system's rows), or (``fresh``, after a step outside it) one drawn from here."""
    keys = ops.noise_keys(batch, stream.seed, purpose)
    source = ops.noise_source(stream)
    if isinstance(source, rng.NormalsAhead):
        return source.window(*keys, fresh=fresh)
    return rng.NormalsWindow(source(*keys), batch.total_steps.numpy().copy(), 1)

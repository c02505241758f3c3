"""Integrator base class: the plugin interface for optimizers and MD methods.

An integrator is a pure description (parameters only).  Everything it remembers
about a system lives in batch fields it declares in :attr:`Integrator.fields`, so a
system can be moved, packed or checkpointed mid-stage without its help.  The step
loop calls, for the systems of its stage (``mask``, a ``[B]`` bool tensor)::

    init_systems(batch, mask)   # a system enters the stage: fresh state
    pre_update(batch, mask)     # before the force call (positions move here)
    post_update(batch, mask)    # after the force call (second half-kick ...)
    converged(batch)            # optimizers: [B] bool, checked on the new forces

Updates must leave unmasked systems bit-for-bit untouched (``torch.where``, never
in-place writes over the whole batch) -- several stages share one batch.  Atoms
with a ``FixAtoms`` constraint are excluded by :meth:`Integrator.atom_mask`.

Time is given in fs and temperature in K; parameters can be Python numbers or
per-system tensors indexed by ``system_id`` (see :meth:`Integrator.per_system`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import numpy as np
import torch

from .. import kernels
from .. import random as rng
from ..convergence import Criterion
from ..state import Batch
from ..tensor_ops import all_set, identity_key, row_sum, same_key
from ..units import fs, kB

if TYPE_CHECKING:
    from ..stages import Fused, Pipeline

Scalar = float | int
T = TypeVar("T")
Param = float | torch.Tensor


@dataclass(frozen=True)
class FieldSpec:
    """A batch field owned by an integrator; created by :meth:`Integrator.setup`."""

    kind: Literal["atom", "system"]
    shape: tuple[int, ...] = ()
    dtype: Literal["float", "int64", "bool"] = "float"
    fill: float | int | bool = 0


def system_sum(batch: Batch, per_atom: torch.Tensor) -> torch.Tensor:
    """Sum per-atom values ``[N]`` (or ``[N, k]``) into systems ``[B]`` (``[B, k]``)."""
    return batch.segments.sum(per_atom)


class Integrator:
    """Base class of every stage method.  See the module docstring for the contract."""

    #: Optimizers converge (criterion) and leave velocities at zero when they exit.
    is_optimizer: ClassVar[bool] = False
    #: Fields this integrator keeps in the batch.
    fields: ClassVar[dict[str, FieldSpec]] = {}
    #: Set by :meth:`compile` (``Simulator(compile=True)``): hot kernels run compiled.
    compiled_kernels: bool = False

    def __init__(self, max_steps: int) -> None:
        if int(max_steps) < 0:
            name = "steps" if isinstance(self, MDIntegrator) else "max_steps"
            raise ValueError(
                f"{type(self).__name__}: {name} (the step budget) must be >= 0, got {max_steps}"
            )
        self.max_steps = int(max_steps)
        self.seed = 0
        self.criterion: Criterion | None = None

    # ----------------------------------------------------------------- plans
    def __add__(self, other: Integrator | Fused) -> Fused:
        from ..stages import Fused

        return Fused([self]) + other

    def __or__(self, other: Any) -> Pipeline:
        from ..stages import Fused

        return Fused([self]) | other

    def __repr__(self) -> str:
        return type(self).__name__

    # ----------------------------------------------------------------- framework calls
    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        """Declare fields on ``batch`` and bind the run's seed (called once per run)."""
        self.seed = int(seed)
        dtypes = {"float": batch.dtype, "int64": torch.int64, "bool": torch.bool}
        for name, spec in self.fields.items():
            batch.ensure_field(name, spec.kind, spec.shape, dtypes[spec.dtype], spec.fill)
        if self.criterion is not None:
            self.criterion.bind(prefix)
            self.criterion.declare(batch)

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        """Reset this integrator's fields for systems entering the stage."""
        for name, spec in self.fields.items():
            t = getattr(batch, name)
            m = mask if spec.kind == "system" else batch.atom_mask(mask)
            t.masked_fill_(m.view(-1, *([1] * (t.dim() - 1))), spec.fill)
        if self.criterion is not None:
            self.criterion.reset(batch, mask)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        """Update before the force call; default: nothing."""

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        """Update after the force call; default: nothing."""

    def converged(self, batch: Batch) -> torch.Tensor | None:
        """Per-system convergence ``[B]`` on the current forces; None for MD."""
        return None if self.criterion is None else self.criterion(batch)

    def compile(self) -> None:
        """Run this integrator's compute-heavy kernels through ``torch.compile`` (the
        per-atom random numbers; see :func:`~alchemi_lit.random.compiled_atom_normals`).
        Called for every stage by ``Simulator(compile=True)``; subclasses with kernels
        of their own extend it.  Only a flag: the integrator stays a picklable
        description, and compiled functions are looked up where they are used."""
        self.compiled_kernels = True

    def normals(self, batch: Batch, purpose: int) -> torch.Tensor:
        """Standard normal ``[N, 3]`` per atom for this step, keyed by (run seed,
        system_id, the system's total step count, ``purpose``, atom index): the same
        for a system wherever and with whomever it runs (see :mod:`alchemi_lit.random`)."""
        return self.noise_source()(*self._noise_keys(batch, purpose))

    def normals_window(self, batch: Batch, purpose: int, fresh: bool = False) -> rng.NormalsWindow:
        """:meth:`normals` for a compiled CPU kernel that picks each system's rows of
        this step itself: the draw that covers this step and maybe the next few, or
        (``fresh``, after the kernel found a step outside it) one drawn from here."""
        keys = self._noise_keys(batch, purpose)
        source = self.noise_source()
        if isinstance(source, rng.NormalsAhead):
            return source.window(*keys, fresh=fresh)
        return rng.NormalsWindow(source(*keys), batch.total_steps.numpy().copy(), 1)

    def _noise_keys(self, batch: Batch, purpose: int) -> tuple[Any, ...]:
        """The arguments of :func:`~alchemi_lit.random.atom_normals` for this step."""
        return (
            self.seed, batch.system_id, batch.total_steps, batch.system_idx,
            batch.segments.local_index, purpose, batch.dtype,
        )  # fmt: skip

    def noise_source(self) -> Callable[..., torch.Tensor]:
        """What draws :meth:`normals`: the compiled kernel after :meth:`compile`, else
        this integrator's :class:`~alchemi_lit.random.NormalsAhead` (on CPU, several
        steps per draw; the same numbers)."""
        if self.compiled_kernels:
            return rng.compiled_atom_normals()
        ahead = self.__dict__.get("_normals_ahead")
        if ahead is None:
            ahead = self._normals_ahead = rng.NormalsAhead()
        return ahead

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (sent to ranks, deep-copied) without drawn random numbers or kept
        constants (:meth:`kept_constants`)."""
        state = self.__dict__.copy()
        state.pop("_normals_ahead", None)
        state.pop("_kept_constants", None)
        return state

    def kept_constants(
        self, batch: Batch, name: str, params: tuple[Any, ...], make: Callable[[], T]
    ) -> T:
        """``make()`` kept under ``name`` while the batch layout (``batch.segments``,
        ``system_id``), its masses and fixed atoms, and ``params`` stay the same (tensors
        by identity and version, numbers by value): the constants of a compiled CPU step
        (``dt / 2m`` per atom, per-system factors) as NumPy arrays, which cost ~50 µs of
        lookups and conversions a step to gather again after the forward."""
        atom = batch.atom  # (the stores themselves: a step reads this right after the model)
        key = identity_key(
            (batch.segments, batch.system["system_id"], atom["masses"], atom["fixed"], *params)
        )
        kept = self.__dict__.setdefault("_kept_constants", {})
        entry = kept.get(name)
        if entry is None or not same_key(entry[0], key):
            entry = kept[name] = (key, make())
        return entry[1]

    # ----------------------------------------------------------------- helpers
    @staticmethod
    def atom_mask(batch: Batch, mask: torch.Tensor) -> torch.Tensor:
        """Atoms ``[N]`` of masked systems that are free to move."""
        return batch.atom_mask(mask) & ~batch.fixed

    @staticmethod
    def moving_atoms(batch: Batch, mask: torch.Tensor) -> torch.Tensor | None:
        """``[N, 1]`` mask of the atoms a stage moves (for :meth:`masked`), or None
        when it moves every atom of the batch.

        None is only returned on CPU, where checking is free: an update of the whole
        batch then needs no ``torch.where``.  On an accelerator the mask is always built.
        """
        if all_set(mask) and not batch.may_have_fixed_atoms():
            return None
        return Integrator.atom_mask(batch, mask).unsqueeze(-1)

    @staticmethod
    def masked(moving: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``new`` for moving atoms (see :meth:`moving_atoms`; an ``[N]`` mask from
        :meth:`atom_mask` works too), ``old`` elsewhere."""
        if moving is None:
            return new
        return torch.where(moving.unsqueeze(-1) if moving.dim() == 1 else moving, new, old)

    @staticmethod
    def per_xyz(batch: Batch, value: Param) -> Param:
        """A :meth:`per_system` value as a contiguous ``[N, 3]`` tensor (numbers pass
        through): elementwise with positions and forces, no broadcast."""
        if isinstance(value, torch.Tensor) and value.dim():
            return batch.segments.to_xyz(value)[0]
        return value

    @staticmethod
    def per_system(batch: Batch, value: Param) -> Param:
        """A parameter as a Python number, or a ``[B]`` tensor gathered by ``system_id``."""
        if isinstance(value, torch.Tensor):
            return value.to(device=batch.device, dtype=batch.dtype)[batch.system_id]
        return value


def _check_param(
    name: str, owner: str, value: Param, minimum: float = 0.0, strict: bool = True
) -> Param:
    """Validate a scalar or tensor parameter with a clear message."""
    if isinstance(value, torch.Tensor):
        bad = ~torch.isfinite(value) | ((value <= minimum) if strict else (value < minimum))
        if bool(bad.any()):
            raise ValueError(f"{owner}: every {name} must be {'>' if strict else '>='} {minimum}")
        return value
    v = float(value)
    if not (v > minimum if strict else v >= minimum) or v != v:
        raise ValueError(
            f"{owner}: {name} must be {'>' if strict else '>='} {minimum}, got {value}"
        )
    return v


def as_param(value: Param | Sequence[float]) -> Param:
    """Accept numbers, tensors or lists (per-system values indexed by system_id)."""
    if isinstance(value, (list, tuple)):
        return torch.as_tensor(value, dtype=torch.float64)
    return value


class MDIntegrator(Integrator):
    """Base of molecular-dynamics integrators: time step, step count, temperature.

    ``steps`` is the stage's length.  With a ``temperature``, a system entering the
    stage with all-zero velocities gets Maxwell-Boltzmann velocities at that
    temperature (zero total momentum), drawn from its own random stream; systems that
    arrive moving keep their velocities.
    """

    def __init__(self, dt: Param, steps: int, temperature: Param | None = None) -> None:
        super().__init__(steps)
        owner = type(self).__name__
        self.dt_fs = _check_param("dt (fs)", owner, as_param(dt))
        self.dt = self.dt_fs * fs
        self.temperature = (
            None
            if temperature is None
            else _check_param("temperature (K)", owner, as_param(temperature), strict=False)
        )

    @property
    def steps(self) -> int:
        return self.max_steps

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)
        if self.temperature is not None:
            still = system_sum(batch, row_sum(batch.velocities.abs())) == 0
            maxwell_boltzmann(batch, mask & still, self.temperature, self.seed)

    # building blocks shared by the MD integrators -----------------------------
    def kick(self, batch: Batch, moving: torch.Tensor | None, dt: Param) -> None:
        """``v += dt F / m`` for the atoms ``moving`` (see :meth:`moving_atoms`).

        One pass over the atoms: ``dt / m`` is kept for the run when ``dt`` is a number.
        """
        if kernels.usable(batch.velocities, batch.forces):  # one compiled pass
            frozen = np.empty(0, dtype=bool) if moving is None else ~moving.reshape(-1).numpy()
            every = np.ones(batch.num_systems, dtype=bool)
            self._compiled_kick(batch, self._kick_constants(batch, dt)[0], every, frozen)
            return
        v = torch.addcmul(batch.velocities, self.kick_factors(batch, dt), batch.forces)
        batch.velocities = self.masked(moving, v, batch.velocities)

    def kick_stage(self, batch: Batch, mask: torch.Tensor, dt: Param) -> None:
        """:meth:`kick` for the free atoms of ``mask``'s systems (an MD step's closing
        half kick), without building their atom mask on CPU."""
        if kernels.usable(batch.velocities, batch.forces):
            factors, fixed = self._kick_constants(batch, dt)
            self._compiled_kick(batch, factors, mask.numpy(), fixed)
            return
        self.kick(batch, self.moving_atoms(batch, mask), dt)

    def kick_drift_stage(
        self, batch: Batch, mask: torch.Tensor, dt: Param, scale: torch.Tensor | None = None
    ) -> None:
        """The opening of a velocity-Verlet step for the free atoms of ``mask``'s systems:
        velocities scaled by ``scale`` ``[B]`` (a thermostat's factor; none by default),
        a kick over ``dt / 2``, a drift over ``dt`` -- one compiled pass on CPU."""
        if kernels.usable(batch.positions, batch.velocities, batch.forces):
            factors, fixed = self._kick_constants(batch, 0.5 * dt)
            starts, counts = batch.segments.bounds
            r, v = kernels.load("dynamics").kick_drift(
                batch.positions.numpy(), batch.velocities.numpy(), batch.forces.numpy(),
                factors, kernels.per_system(batch, dt),
                kernels.per_system(batch, 1.0 if scale is None else scale),
                starts, counts, mask.numpy(), fixed,
            )  # fmt: skip
            batch.positions, batch.velocities = torch.from_numpy(r), torch.from_numpy(v)
            return
        moving = self.moving_atoms(batch, mask)
        if scale is not None:
            (scale3,) = batch.segments.to_xyz(scale)
            batch.velocities = self.masked(moving, batch.velocities * scale3, batch.velocities)
        self.kick(batch, moving, 0.5 * dt)
        self.drift(batch, moving, dt)

    def _kick_constants(self, batch: Batch, dt: Param) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`kick_factors` per atom ``[N]`` and the fixed-atom mask as arrays for the
        compiled kicks, kept while ``dt`` and the layout stay
        (:meth:`~Integrator.kept_constants`)."""
        return self.kept_constants(
            batch,
            "kick",
            (dt,),
            lambda: (per_atom(self.kick_factors(batch, dt)), batch.fixed.numpy()),
        )

    def compiled_noisy_step(
        self, batch: Batch, mask: torch.Tensor, purpose: int, kernel: Callable[..., Any],
        constants: Sequence[np.ndarray],
    ) -> None:  # fmt: skip
        """New positions and velocities from a compiled kernel that also reads this
        step's keyed noise: ``kernel(r, v, f, *constants, noise, noise_base, step,
        noise_steps, starts, counts, mask, fixed)`` returns ``(r, v, covered)``; run on
        the draw covering the step (:meth:`~Integrator.normals_window`), and again on a
        fresh draw if a system's step lies outside it (``covered`` False)."""
        starts, counts = batch.segments.bounds
        r, v, f = batch.positions.numpy(), batch.velocities.numpy(), batch.forces.numpy()
        for fresh in (False, True):
            noise = self.normals_window(batch, purpose, fresh)
            r_new, v_new, covered = kernel(
                r, v, f, *constants, noise.values.numpy(), noise.base, batch.total_steps.numpy(),
                noise.steps, starts, counts, mask.numpy(), batch.fixed.numpy(),
            )  # fmt: skip
            if covered:
                break
        batch.positions, batch.velocities = torch.from_numpy(r_new), torch.from_numpy(v_new)

    @staticmethod
    def _compiled_kick(
        batch: Batch, factors: np.ndarray, mask: np.ndarray, frozen: np.ndarray
    ) -> None:
        starts, counts = batch.segments.bounds
        v_new = kernels.load("dynamics").kick(
            batch.velocities.numpy(), batch.forces.numpy(), factors, starts, counts, mask, frozen,
        )  # fmt: skip
        batch.velocities = torch.from_numpy(v_new)

    def kick_factors(self, batch: Batch, dt: Param) -> torch.Tensor:
        """``dt / m`` per atom component ``[N, 3]``, kept for the run when ``dt`` is a number."""
        seg = batch.segments
        if isinstance(dt, torch.Tensor):
            return self.per_xyz(batch, dt) / seg.atom_xyz(batch.masses)
        return seg.derived_xyz(batch.masses, ("dt/m", dt), lambda m: dt / m)

    def drift(self, batch: Batch, moving: torch.Tensor | None, dt: Param) -> None:
        """``r += dt v`` for the atoms ``moving`` (see :meth:`moving_atoms`)."""
        if isinstance(dt, torch.Tensor):
            r = torch.addcmul(batch.positions, self.per_xyz(batch, dt), batch.velocities)
        else:
            r = torch.add(batch.positions, batch.velocities, alpha=dt)
        batch.positions = self.masked(moving, r, batch.positions)

    def dt_tensor(self, batch: Batch) -> Param:
        return self.per_system(batch, self.dt)


def per_atom(per_component: torch.Tensor) -> np.ndarray:
    """An ``[N, 3]`` factor that repeats one value per atom, as that ``[N]`` array (for
    the compiled kernels, which read one number per atom)."""
    return per_component[:, 0].contiguous().numpy()


def maxwell_boltzmann(batch: Batch, mask: torch.Tensor, temperature: Param, seed: int) -> None:
    """Draw velocities at ``temperature`` (K) for masked systems; zero total momentum.

    Like ``ase.md.velocitydistribution.MaxwellBoltzmannDistribution`` followed by
    ``Stationary`` (no rescaling to the exact temperature), but keyed per system.
    Fixed atoms stay at rest.
    """
    am = batch.atom_mask(mask) & ~batch.fixed
    t = Integrator.per_system(batch, temperature)
    t_atom = t.index_select(0, batch.system_idx) if isinstance(t, torch.Tensor) else t
    z = _velocity_normals(batch, mask, seed)
    sigma = torch.sqrt(
        kB * torch.as_tensor(t_atom, dtype=batch.dtype, device=batch.device) / batch.masses
    )
    v = z * sigma.unsqueeze(-1) if sigma.dim() else z * sigma
    v = torch.where(am.unsqueeze(-1), v, torch.zeros_like(v))
    m = batch.masses.unsqueeze(-1) * am.unsqueeze(-1)
    p_tot = system_sum(batch, m * v)
    m_tot = system_sum(batch, m[:, 0]).clamp_min(1e-30)
    v = torch.where(
        am.unsqueeze(-1), v - (p_tot / m_tot.unsqueeze(-1)).index_select(0, batch.system_idx), v
    )
    batch.velocities = torch.where(batch.atom_mask(mask).unsqueeze(-1), v, batch.velocities)


def _velocity_normals(batch: Batch, mask: torch.Tensor, seed: int) -> torch.Tensor:
    """The keyed normals of velocity initialisation ``[N, 3]``, meaningful for the atoms
    of ``mask``'s systems.  On CPU only those atoms are drawn (the same numbers: each is
    a function of its key): with many small systems a few enter an MD stage at almost
    every step, and drawing for the whole batch each time was a tenth of the run."""
    idx, local = batch.system_idx, batch.segments.local_index
    rows = mask.nonzero().flatten() if batch.device.type == "cpu" else None
    atoms = None
    if rows is not None and len(rows) < batch.num_systems:
        atoms = batch.atom_index(rows)
        idx, local = idx.index_select(0, atoms), local.index_select(0, atoms)
    z = rng.atom_normals(
        seed,
        batch.system_id,
        batch.total_steps,
        idx,
        local,
        rng.PURPOSE_VELOCITY_INIT,
        batch.dtype,
    )
    if atoms is None:
        return z
    return z.new_zeros((batch.num_atoms, 3)).index_copy_(0, atoms, z)

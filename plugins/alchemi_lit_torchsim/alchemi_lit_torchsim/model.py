"""Any TorchSim model (``torch_sim.models.interface.ModelInterface``) as an alchemi_lit model.

Why: TorchSim wraps many MLIPs behind one batched interface (MACE, SevenNet, FairChem,
ORB, MatterSim, metatomic, ...: ``model(state) -> {"energy", "forces", "stress"}``).
Wrapping that interface once makes all of them usable in alchemi_lit's plans, pipelines
and configs, batched as TorchSim batches them.

Batch -> SimState (:func:`to_sim_state`) shares the tensors, no copies: positions,
masses, atomic numbers and ``system_idx`` are the batch's own tensors, and the cell is
a transposed *view* of the batch's cell, because TorchSim stores cells with lattice
vectors as columns (``SimState.cell``; ``row_vector_cell`` is ASE's and ours).  A copy
happens only where the wrapped model needs another dtype or device than the batch (its
``dtype`` and ``device`` are fixed when it is built) -- e.g. a float32 model in a
float64 run; its outputs are cast back to the batch's dtype.

Periodic boundaries: a SimState has one ``pbc`` for all its systems (one flag for all
axes before TorchSim 0.4.1, one per axis since).  A batch whose systems differ in pbc
(a crystal and a molecule) is evaluated as one SimState per pbc pattern.

The fields used are those stable across TorchSim releases (0.3 to 0.6): ``SimState``'s
constructor keywords ``positions, masses, cell, pbc, atomic_numbers, system_idx``, and
the model's ``dtype``, ``device`` and ``compute_stress``.  Stress is taken as the model
returns it: TorchSim uses ASE's sign convention, ours.  Systems without a 3-D cell get
zero stress (TorchSim divides by a zero volume there).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import torch

from alchemi_lit.core.errors import ConfigError, ModelError
from alchemi_lit.core.state import Batch
from alchemi_lit.models.base import _MIN_VOLUME, Model
from alchemi_lit.models.neighbors import NeighborList


def _per_axis_pbc() -> bool:
    """Whether the installed TorchSim takes one pbc flag per axis (0.4.1 and later)."""
    version = metadata.version("torch-sim-atomistic")
    numbers = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
    return numbers >= (0, 4, 1)


def to_sim_state(
    batch: Batch, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> Any:
    """A ``torch_sim.SimState`` viewing ``batch``'s tensors (copies only to change dtype
    or device).  All systems must share one pbc pattern (see module docstring)."""
    import torch_sim as ts

    pbc = batch.pbc
    if len(pbc) and not bool((pbc == pbc[0]).all()):
        raise ModelError(
            "to_sim_state: a SimState has one pbc for all its systems, and these differ; "
            "select the systems of one pbc pattern first (TorchSimModel does)"
        )
    flags = pbc[0] if len(pbc) else torch.ones(3, dtype=torch.bool, device=batch.device)
    if _per_axis_pbc():
        state_pbc: Any = flags
    elif bool(flags.all()) or not bool(flags.any()):
        state_pbc = bool(flags[0])
    else:
        raise ModelError(
            f"TorchSim {metadata.version('torch-sim-atomistic')} takes one pbc flag for all "
            f"axes, and these systems are periodic along {flags.tolist()} only (a slab?); "
            f"install torch-sim-atomistic >= 0.4.1, or give them a fully periodic cell"
        )

    def cast(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device) if device is not None else t
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t

    return ts.SimState(
        positions=cast(batch.positions),
        masses=cast(batch.masses),
        cell=cast(batch.cell).mT,  # column vectors: a view
        pbc=cast(state_pbc) if isinstance(state_pbc, torch.Tensor) else state_pbc,
        atomic_numbers=cast(batch.atomic_numbers),
        system_idx=cast(batch.system_idx),
    )


def from_sim_state(state: Any) -> Batch:
    """A :class:`Batch` of a ``torch_sim.SimState``: positions, masses, atomic numbers and
    ``system_idx`` are the state's tensors (no copy); velocities come from ``momenta``
    where the state has them (an MD state), else zero; system ids are ``0..B-1``."""
    system_idx = state.system_idx
    n_atoms = torch.bincount(system_idx)
    n_sys, n, dev, dt = len(n_atoms), len(system_idx), state.positions.device, state.dtype
    momenta = getattr(state, "momenta", None)
    pbc = torch.as_tensor(state.pbc, dtype=torch.bool, device=dev).reshape(-1).expand(3)

    def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=dev)

    atom = {
        "positions": state.positions,
        "velocities": momenta / state.masses.unsqueeze(-1)
        if momenta is not None
        else zeros(n, 3, dtype=dt),
        "forces": zeros(n, 3, dtype=dt),
        "masses": state.masses,
        "atomic_numbers": state.atomic_numbers,
        "system_idx": system_idx,
        "fixed": zeros(n, dtype=torch.bool),
        "tags": zeros(n),
    }
    system = {
        "cell": state.row_vector_cell.contiguous(),  # 3x3 per system: the copy is tiny
        "pbc": pbc.expand(n_sys, 3).clone(),
        "energy": torch.full((n_sys,), float("nan"), dtype=dt, device=dev),
        "stress": zeros(n_sys, 3, 3, dtype=dt),
        "n_atoms": n_atoms,
        "system_id": torch.arange(n_sys, device=dev),
        "status": zeros(n_sys),
        "step": zeros(n_sys),
        "total_steps": zeros(n_sys),
        "converged": zeros(n_sys, dtype=torch.bool),
        "exit_code": zeros(n_sys),
    }
    return Batch(atom, system)


class TorchSimModel(Model):
    """A TorchSim ``ModelInterface`` model, batched as TorchSim batches it.

    The wrapped model keeps the device and dtype it was built with (TorchSim fixes both
    at construction); batches are moved/cast to them for the call and the results back.
    It is not a submodule: ``.to()`` on this wrapper does not move it.

    Args:
        model: the TorchSim model (``torch_sim.models.*``, or any ``ModelInterface``), or
            the dotted import path of its class (configs), built with ``model_args``.
        model_args: keyword arguments of the model class when ``model`` is a path.
        cutoff: its interaction range in Å, used only to estimate neighbour counts for
            batch budgets; default: the model's ``cutoff`` or ``r_max`` attribute.
        compute_stress: return the stress in every call (else only when asked); default:
            the model's own ``compute_stress``.  The model must have been built to
            compute stress when any is needed.
    """

    def __init__(
        self,
        model: str | torch.nn.Module,
        model_args: dict[str, Any] | None = None,
        cutoff: float | None = None,
        compute_stress: bool | None = None,
    ) -> None:
        if isinstance(model, str):
            model = build_model(model, model_args)
        elif model_args:
            raise ConfigError(
                "TorchSimModel: model_args are for a model given by its import path; "
                "this model is already built"
            )
        if not callable(model) or not hasattr(model, "compute_stress"):
            raise TypeError(
                f"TorchSimModel wraps a TorchSim ModelInterface model (torch_sim.models...), "
                f"got {type(model).__name__}"
            )
        if cutoff is None:
            cutoff = getattr(model, "cutoff", None) or getattr(model, "r_max", None)
            if cutoff is None:
                raise ValueError(
                    f"TorchSimModel: {type(model).__name__} has no cutoff or r_max attribute; "
                    f"pass cutoff= (its interaction range in Å)"
                )
        stress = bool(model.compute_stress) if compute_stress is None else compute_stress
        super().__init__(float(cutoff), 0.0, stress)
        self.__dict__["wrapped"] = model  # not a submodule: see the class docstring

    def compile(self, **options: Any) -> bool:  # type: ignore[override]
        """The wrapped model is TorchSim's to compile; nothing is compiled here."""
        return False

    def forward(
        self,
        batch: Batch,
        compute_stress: bool | None = None,
        neighbors: NeighborList | None = None,
    ) -> dict[str, torch.Tensor]:
        """Energy ``[B]``, forces ``[N, 3]`` and (if asked) stress ``[B, 3, 3]`` from the
        wrapped model; ``neighbors`` is ignored (TorchSim models build their own)."""
        want_stress = self.compute_stress if compute_stress is None else compute_stress
        if want_stress and not self.wrapped.compute_stress:
            raise ModelError(
                f"TorchSimModel: the wrapped {type(self.wrapped).__name__} was built with "
                f"compute_stress=False and the stress is needed; build it with "
                f"compute_stress=True, or build TorchSimModel with compute_stress=False and "
                f"use no stage that needs the stress"
            )
        patterns = torch.unique(batch.pbc, dim=0) if batch.num_systems else batch.pbc
        if len(patterns) <= 1:
            out = self._evaluate(batch, want_stress)
        else:  # one SimState per pbc pattern (module docstring)
            out = self._by_pbc(batch, patterns, want_stress)
        if want_stress:
            flat = (batch.volume <= _MIN_VOLUME).view(-1, 1, 1)
            out["stress"] = torch.where(flat, torch.zeros_like(out["stress"]), out["stress"])
        return out

    def _evaluate(self, batch: Batch, want_stress: bool) -> dict[str, torch.Tensor]:
        model = self.wrapped
        device = torch.device(model.device) if model.device is not None else batch.device
        dtype = model.dtype or batch.dtype
        state = to_sim_state(
            batch,
            dtype=None if dtype == batch.dtype else dtype,
            device=None if device == batch.device else device,
        )
        raw = model(state)
        missing = [k for k in ("energy", "forces", *(["stress"] * want_stress)) if k not in raw]
        if missing:
            raise ModelError(
                f"TorchSimModel: {type(model).__name__} returned no {' or '.join(missing)} "
                f"(it returned {sorted(raw)}); build it to compute them"
            )

        def back(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(device=batch.device, dtype=batch.dtype)

        out = {"energy": back(raw["energy"]).reshape(-1), "forces": back(raw["forces"])}
        if want_stress:
            out["stress"] = back(raw["stress"]).reshape(-1, 3, 3)
        return out

    def _by_pbc(
        self, batch: Batch, patterns: torch.Tensor, want_stress: bool
    ) -> dict[str, torch.Tensor]:
        energy = batch.positions.new_zeros(batch.num_systems)
        forces = torch.zeros_like(batch.positions)
        stress = batch.positions.new_zeros(batch.num_systems, 3, 3)
        for pattern in patterns:
            rows = (batch.pbc == pattern).all(-1).nonzero().squeeze(1)
            part = self._evaluate(batch.select(rows), want_stress)
            energy[rows] = part["energy"]
            forces[batch.atom_index(rows)] = part["forces"]
            if want_stress:
                stress[rows] = part["stress"]
        out = {"energy": energy, "forces": forces}
        if want_stress:
            out["stress"] = stress
        return out

    def stress(self, batch: Batch) -> torch.Tensor:
        """Stress of ``batch`` in a one-off evaluation (see :meth:`Model.stress`)."""
        return self.forward(batch, compute_stress=True)["stress"]


def build_model(path: str, args: dict[str, Any] | None = None) -> torch.nn.Module:
    """The TorchSim model class at dotted import ``path``, built with ``args``.

    Configs give values as text; arguments annotated ``torch.dtype`` or ``torch.device``
    (TorchSim models take both) are converted from ``"float64"`` / ``"torch.float64"``
    and ``"cpu"`` / ``"cuda:0"``.
    """
    import importlib
    import inspect

    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"TorchSimModel: cannot import model class {path!r} ({exc}); give its full "
            f"dotted path, e.g. 'torch_sim.models.lennard_jones.LennardJonesModel'"
        ) from exc
    kwargs = dict(args or {})
    params = inspect.signature(cls).parameters
    for key, value in kwargs.items():
        hint = str(params[key].annotation) if key in params else ""
        if isinstance(value, str) and "dtype" in hint:
            kwargs[key] = _dtype(value, key)
        elif isinstance(value, str) and "device" in hint:
            kwargs[key] = torch.device(value)
    return cls(**kwargs)


def _dtype(text: str, key: str) -> torch.dtype:
    value = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"TorchSimModel: {key}={text!r} is not a torch dtype (float32, float64)")
    return value


__all__ = ["TorchSimModel", "build_model", "from_sim_state", "to_sim_state"]

"""Any ASE calculator as an alchemi_lit model -- the slow path.

Why: every code with an ASE interface (DFT codes, tight binding, MLIPs without a batched
plugin, classical potentials) becomes usable in fused plans, pipelines and configs
without writing a model class.  The price: an ASE calculator evaluates one
``ase.Atoms`` at a time on the host, so each step loops over the systems in Python and
copies positions to the host and forces back.  Throughput is that of the calculator
alone; nothing is batched.  Prefer a batched model (built-ins, plugins) when one exists;
the run summary says when this slow path was used.

How a system is evaluated: an ``ase.Atoms`` is built from the batch row (numbers,
positions, cell, pbc, masses, and the system's ``info`` and extra per-atom ``arrays``
that :meth:`Batch.from_atoms` carried, e.g. ``initial_magmoms``), *without*
constraints: the calculator's raw forces come back and the step loop applies the
constraints, as for every model (:mod:`~alchemi_lit.integrators.constrain`;
ASE's ``get_forces`` would apply them itself).  Energy is ASE's ``"energy"`` (what
``get_potential_energy`` returns); stress is ASE's ``(1/V) dE/dε`` in eV/Å^3, the convention of
:class:`~alchemi_lit.models.Model`, converted from Voigt order to 3x3; systems without
a 3-D cell get zero stress without asking the calculator.

Calculators are built from a *factory* (a class or any zero-argument callable, or a
dotted import path plus keyword arguments for configs), never taken as an instance:
an instance is tied to one structure's state and cannot be sent to pipeline ranks.
Each process builds its own, lazily.  With ``per_system=False`` (default) one
calculator evaluates every system in turn (right for MLIP calculators, which load
their weights once); with ``per_system=True`` each system in flight has its own, so a
code that keeps state between calls (a DFT code's wavefunctions) restarts from it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from ..core.errors import ConfigError, ModelError
from ..core.state import ARRAYS_KEY, MODEL_ERROR_KEY, Batch
from .base import _MIN_VOLUME, Model
from .neighbors import NeighborList

#: calls after which a per-system calculator not used since is released (its system
#: has left the batch; a system still in flight is evaluated in every loop step)
_STALE_CALLS = 8


def resolve_factory(
    calculator: str | Callable[..., Any], calculator_args: dict[str, Any] | None
) -> Callable[[], Any]:
    """A zero-argument callable that builds a new calculator.

    ``calculator`` is a class or factory, or its dotted import path
    (``"ase.calculators.emt.EMT"``); ``calculator_args`` are passed to it.
    """
    target: Any = calculator
    if isinstance(calculator, str):
        module, _, name = calculator.rpartition(".")
        try:
            target = getattr(importlib.import_module(module), name) if module else None
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"ASECalculatorModel: cannot import calculator {calculator!r} ({exc}); give "
                f"the full dotted path of a calculator class, e.g. 'ase.calculators.emt.EMT'"
            ) from exc
        if target is None:
            raise ConfigError(
                f"ASECalculatorModel: calculator {calculator!r} is not a dotted import path; "
                f"give e.g. 'ase.calculators.emt.EMT'"
            )
    if hasattr(target, "get_property") and not isinstance(target, type):
        raise ConfigError(
            f"ASECalculatorModel: got a calculator instance ({type(target).__name__}); pass "
            f"its class or a zero-argument factory instead (e.g. "
            f"functools.partial({type(target).__name__}, ...)): an instance holds one "
            f"structure's state and cannot be copied to pipeline ranks"
        )
    if not callable(target):
        raise ConfigError(
            f"ASECalculatorModel: calculator must be a class, a factory or a dotted import "
            f"path, got {type(target).__name__}"
        )
    return partial(target, **calculator_args) if calculator_args else target


def _name(factory: Callable[..., Any]) -> str:
    inner = getattr(factory, "func", factory)  # functools.partial
    return getattr(inner, "__name__", type(inner).__name__)


class ASECalculatorModel(Model):
    """An ASE calculator, evaluated one system at a time on the host (slow path).

    See the module docstring for what is passed to the calculator and why a factory.

    Args:
        calculator: calculator class, zero-argument factory, or dotted import path
            (``"ase.calculators.emt.EMT"``).
        calculator_args: keyword arguments for ``calculator`` (configs: the
            calculator's own parameters).
        per_system: one calculator per system in flight (keeps each system's state
            between steps) instead of one for all.
        cutoff: interaction range in Å, used only to estimate a system's neighbour
            count for batch budgets (``SizeAwareSampler(max_edges=...)``); the
            calculator applies its own.
        compute_stress: return the stress in every call (else only when asked); the
            calculator must implement ``"stress"`` when it is needed.
    """

    summary_note = "slow path: an ASE calculator evaluates one system at a time on the host"

    def __init__(
        self,
        calculator: str | Callable[..., Any],
        calculator_args: dict[str, Any] | None = None,
        per_system: bool = False,
        cutoff: float = 5.0,
        compute_stress: bool = True,
    ) -> None:
        super().__init__(cutoff, 0.0, compute_stress)
        self.factory = resolve_factory(calculator, calculator_args)
        self.calculator_name = _name(self.factory)
        self.per_system = bool(per_system)
        self.summary_note = (
            f"slow path: ASE calculator {self.calculator_name}, one system at a time on the host"
        )
        self._calcs: dict[int, list[Any]] = {}  # system_id (-1: shared) -> [calc, last call]
        self._calls = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_calcs"] = {}  # each process (pipeline rank) builds its own calculators
        return state

    def compile(self, **options: Any) -> bool:  # type: ignore[override]
        """Nothing to compile: the calculator runs outside torch."""
        warnings.warn(
            f"ASECalculatorModel({self.calculator_name}) cannot be compiled; it stays eager",
            stacklevel=2,
        )
        return False

    # ------------------------------------------------------------ calculators
    def _calculator(self, system_id: int, stress: bool) -> Any:
        key = system_id if self.per_system else -1
        entry = self._calcs.get(key)
        if entry is None:
            calc = self.factory()
            self._check_properties(calc, stress=False)
            entry = self._calcs[key] = [calc, self._calls]
        entry[1] = self._calls
        if stress:
            self._check_properties(entry[0], stress=True)
        return entry[0]

    def _check_properties(self, calc: Any, stress: bool) -> None:
        have = set(getattr(calc, "implemented_properties", ()) or ())
        need = ["stress"] if stress else ["energy", "forces"]
        missing = [p for p in need if p not in have]
        if missing:
            fix = (
                "build the model with compute_stress=False and use no stage that needs the stress"
                if stress
                else "choose a calculator that computes energies and forces"
            )
            raise ModelError(
                f"ASECalculatorModel: calculator {type(calc).__name__} does not implement "
                f"{' and '.join(missing)} (it implements {sorted(have)}); {fix}"
            )

    def _release_stale(self) -> None:
        if self.per_system:
            old = [k for k, (_, last) in self._calcs.items() if self._calls - last > _STALE_CALLS]
            for k in old:
                del self._calcs[k]

    # ------------------------------------------------------------ evaluation
    def forward(
        self,
        batch: Batch,
        compute_stress: bool | None = None,
        neighbors: NeighborList | None = None,
    ) -> dict[str, torch.Tensor]:
        """Energy ``[B]``, forces ``[N, 3]`` and (if asked) stress ``[B, 3, 3]``, one
        calculator call per system.  ``neighbors`` is ignored (the calculator finds its
        own)."""
        from ase import Atoms
        from ase.stress import voigt_6_to_full_3x3_stress

        want_stress = self.compute_stress if compute_stress is None else compute_stress
        self._calls += 1
        host = {
            k: batch.atom[k].detach().cpu().numpy()
            for k in ("positions", "atomic_numbers", "masses")
        }
        cells = batch.cell.detach().cpu().to(torch.float64).numpy()
        pbcs = batch.pbc.cpu().numpy()
        ids = batch.system_id.tolist()
        ptr = batch.ptr.tolist()
        flat = (batch.volume <= _MIN_VOLUME).tolist()
        energy = np.zeros(batch.num_systems)
        forces = np.zeros((batch.num_atoms, 3))
        stress = np.zeros((batch.num_systems, 3, 3))
        for b, sid in enumerate(ids):
            lo, hi = ptr[b], ptr[b + 1]
            atoms = Atoms(
                numbers=host["atomic_numbers"][lo:hi],
                positions=host["positions"][lo:hi].astype(np.float64),
                cell=cells[b],
                pbc=pbcs[b],
                masses=host["masses"][lo:hi].astype(np.float64),
            )
            info = batch.info.get(sid)
            if info:
                atoms.info.update({k: v for k, v in info.items() if k not in _NOT_INFO})
                for name, values in info.get(ARRAYS_KEY, {}).items():
                    atoms.set_array(name, np.asarray(values))
            calc = self._calculator(sid, want_stress and not flat[b])
            try:
                energy[b] = calc.get_property("energy", atoms)
                forces[lo:hi] = calc.get_property("forces", atoms)
                if want_stress and not flat[b]:
                    s = np.asarray(calc.get_property("stress", atoms))
                    stress[b] = voigt_6_to_full_3x3_stress(s) if s.shape == (6,) else s
            except Exception as exc:
                # a calculator that failed may keep a broken state (EMT's arrays for the
                # failing species): the next system gets a fresh one
                self._calcs.pop(sid if self.per_system else -1, None)
                raise ModelError(
                    f"ASECalculatorModel: calculator {type(calc).__name__} failed on system "
                    f"{sid} ({type(exc).__name__}: {exc})"
                ) from exc
        self._release_stale()

        def back(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(x).to(device=batch.device, dtype=batch.dtype)

        out = {"energy": back(energy), "forces": back(forces)}
        if want_stress:
            out["stress"] = back(stress)
        return out

    def stress(self, batch: Batch) -> torch.Tensor:
        """Stress of ``batch`` in a one-off evaluation (see :meth:`Model.stress`)."""
        return self.forward(batch, compute_stress=True)["stress"]


#: ``info`` entries that are alchemi_lit's own bookkeeping, not the structure's
_NOT_INFO = frozenset({ARRAYS_KEY, MODEL_ERROR_KEY})

__all__ = ["ASECalculatorModel", "resolve_factory"]

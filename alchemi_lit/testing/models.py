"""Contract checks for a model plugin, to run in the plugin's own test-suite.

A model maps a batch to per-system energies, forces and stress (see
:class:`~alchemi_lit.models.Model`); the run loop trusts that forces are minus the
energy's gradient, that the stress is ASE's ``(1/V) dE/d(strain)`` (it drives cell
filters and barostats), that a system's numbers do not depend on the others in its
batch, and that the model pickles (pipelines send it to ranks).
:func:`check_model` checks each by finite differences and comparisons, in float64;
:func:`check_pipeline_equals_fused` (two forked processes, so kept apart) checks that
a plan split over ranks gives the fused run's results bit for bit::

    from alchemi_lit.testing import check_model

    def test_my_model_keeps_the_contract():
        check_model(MyModel(...), my_structures())
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch

from ..core.state import Batch
from ..integrators import FIRE
from ..models.base import Model
from ..simulator import Simulator


class DoubleWell(Model):
    """An analytic double well for every atom, no interactions: ``U = barrier (x² - a²)²
    / a⁴ + spring (y² + z²) / 2`` (eV, Å), so ``x`` has two minima at ``±a`` separated by
    ``barrier`` and its Boltzmann marginal ``exp(-U(x) / kT)`` is known by quadrature --
    the reference of replica-exchange tests.  A system's energy is the sum over its
    atoms; forces are the exact gradient, stress zero (no cell dependence).

    Args:
        barrier: height of the barrier at ``x = 0`` (eV).
        a: position of the minima (Å).
        spring: harmonic constant across the well (eV/Å²; 0: free in y and z).
    """

    def __init__(self, barrier: float = 0.1, a: float = 1.0, spring: float = 1.0) -> None:
        super().__init__(cutoff=1.0, skin=0.0)
        self.barrier, self.a, self.spring = float(barrier), float(a), float(spring)

    def potential(self, x: torch.Tensor) -> torch.Tensor:
        """``U(x)`` of the double-well coordinate alone (eV)."""
        return self.barrier * (x * x - self.a**2) ** 2 / self.a**4

    def forward(
        self, batch: Batch, compute_stress: bool | None = None, neighbors: Any = None
    ) -> dict[str, torch.Tensor]:
        r = batch.positions
        x, yz = r[:, 0], r[:, 1:]
        per_atom = self.potential(x) + 0.5 * self.spring * (yz * yz).sum(-1)
        forces = torch.empty_like(r)
        forces[:, 0] = -4.0 * self.barrier * x * (x * x - self.a**2) / self.a**4
        forces[:, 1:] = -self.spring * yz
        energy = batch.segments.sum(per_atom)
        out = {"energy": energy, "forces": forces}
        if self.compute_stress if compute_stress is None else compute_stress:
            out["stress"] = torch.zeros((batch.num_systems, 3, 3), dtype=r.dtype, device=r.device)
        return out

    def stress(self, batch: Batch) -> torch.Tensor:
        return torch.zeros((batch.num_systems, 3, 3), dtype=batch.dtype, device=batch.device)


#: the fields a pipeline's results must share with the fused run's, bit for bit
PIPELINE_COMPARED = ("positions", "velocities", "forces", "energy", "stress", "total_steps")


def check_model(
    model: Any,
    structures: list[Any],
    rtol: float = 1e-6,
    delta: float = 1e-4,
) -> None:
    """Every model contract check on ``structures`` (``ase.Atoms``, periodic ones for the
    stress); ``rtol`` bounds the finite-difference disagreement, ``delta`` is the
    displacement (Å) and strain of the central differences."""
    check_forces_are_the_energy_gradient(model, structures, rtol, delta)
    check_stress_is_the_strain_derivative(model, structures, rtol, delta)
    check_batch_independence(model, structures)
    check_pickles(model, structures)


def _evaluate(model: Any, atoms: list[Any], **kw: Any) -> dict[str, torch.Tensor]:
    batch = Batch.from_atoms(atoms, dtype=torch.float64, validate=False)
    return {k: v.detach() for k, v in model(batch, **kw).items()}


def _close(got: float, want: float, rtol: float, scale: float, what: str) -> None:
    assert abs(got - want) <= rtol * max(scale, 1e-3) + 1e-9, (
        f"{what}: {got:.10g} from the model, {want:.10g} by finite differences"
    )


def check_forces_are_the_energy_gradient(
    model: Any, structures: list[Any], rtol: float = 1e-6, delta: float = 1e-4
) -> None:
    """Each force component of the first atoms equals ``-dE/dx`` by central differences."""
    for k, atoms in enumerate(structures):
        forces = _evaluate(model, [atoms])["forces"].numpy()
        scale = float(np.abs(forces).max())
        for atom in range(min(2, len(atoms))):
            for axis in range(3):
                energies = []
                for sign in (1, -1):
                    moved = atoms.copy()
                    moved.positions[atom, axis] += sign * delta
                    energies.append(float(_evaluate(model, [moved])["energy"][0]))
                fd = -(energies[0] - energies[1]) / (2 * delta)
                what = f"structure {k}, force on atom {atom} along {'xyz'[axis]}"
                _close(float(forces[atom, axis]), fd, rtol, scale, what)


def check_stress_is_the_strain_derivative(
    model: Any, structures: list[Any], rtol: float = 1e-6, delta: float = 1e-4
) -> None:
    """The stress of periodic structures equals ``(1/V) dE/d(strain)`` (ASE's sign:
    positive under tension) by central differences of a symmetric strain."""
    for k, atoms in enumerate(structures):
        if not atoms.pbc.all():
            continue
        stress = _evaluate(model, [atoms], compute_stress=True)["stress"][0].numpy()
        scale = float(np.abs(stress).max())
        volume = atoms.get_volume()
        for i, j in [(0, 0), (1, 1), (2, 2), (0, 1), (1, 2)]:
            energies = []
            for sign in (1, -1):
                strain = np.eye(3)
                strain[i, j] += sign * delta / (2 if i != j else 1)
                strain[j, i] += sign * delta / 2 if i != j else 0.0
                strained = atoms.copy()
                strained.set_cell(atoms.cell.array @ strain, scale_atoms=True)
                energies.append(float(_evaluate(model, [strained])["energy"][0]))
            fd = (energies[0] - energies[1]) / (2 * delta) / volume
            _close(float(stress[i, j]), fd, rtol, scale, f"structure {k}, stress[{i}, {j}]")


def check_batch_independence(model: Any, structures: list[Any], rtol: float = 1e-10) -> None:
    """Each system's energy and forces alone equal its share of a batch evaluation."""
    together = _evaluate(model, structures)
    start = 0
    for k, atoms in enumerate(structures):
        alone = _evaluate(model, [atoms])
        n = len(atoms)
        energy_ok = torch.allclose(alone["energy"][0], together["energy"][k], rtol=rtol, atol=0)
        forces_ok = torch.allclose(
            alone["forces"], together["forces"][start : start + n], rtol=rtol, atol=1e-12
        )
        assert energy_ok and forces_ok, f"structure {k}: alone and in a batch differ"
        start += n


def check_pickles(model: Any, structures: list[Any]) -> None:
    """The model pickles and gives the same numbers afterwards."""
    copy = pickle.loads(pickle.dumps(model))
    a, b = _evaluate(model, structures[:1]), _evaluate(copy, structures[:1])
    assert torch.equal(a["energy"], b["energy"]) and torch.equal(a["forces"], b["forces"]), (
        f"{type(model).__name__} gives other numbers after pickling"
    )


def check_pipeline_equals_fused(
    model: Any, structures: list[Any], steps: tuple[int, int] = (3, 2), timeout: float = 60.0
) -> Any:
    """``FIRE + FIRE`` in one process and ``FIRE | FIRE`` on two forked ranks give the
    same results bit for bit (the model survives the trip to a rank and evaluates there
    as at home); returns the fused run's results for further checks.  Stress is NaN
    where it was not computed, and NaN equals NaN here."""

    def plan(join: str) -> Any:
        first, second = FIRE(fmax=0.05, max_steps=steps[0]), FIRE(fmax=0.05, max_steps=steps[1])
        return first + second if join == "+" else first | second

    kw: dict[str, Any] = {"precision": "64", "sync_every": 2}
    fused = Simulator(model, plan("+"), **kw).run(structures)
    piped = Simulator(
        model, plan("|"), devices=2, strategy="pipeline", start_method="fork",
        timeout=timeout, **kw,
    ).run(structures)  # fmt: skip
    got, want = piped.batch, fused.batch
    assert got.system_id.tolist() == want.system_id.tolist(), "systems differ or out of order"
    for name in PIPELINE_COMPARED:
        a, b = getattr(got, name).nan_to_num(7.0), getattr(want, name).nan_to_num(7.0)
        assert torch.equal(a, b), f"{name}: the pipeline's results differ from the fused run's"
    return fused

"""Every job of every material in one batched Simulator run.

A property workflow is many independent single points or relaxations (strained cells,
displaced supercells).  Run one material at a time through a calculator, each job costs
a model call of its own; here the jobs of all materials are one dataset of one
:class:`~alchemi_lit.Simulator` run, so they share forwards, the inflight sampler, the
sinks and checkpoint/resume exactly as any run does.  Job ``k`` of the flat list gets
``system_id = k``: the order is fixed by the inputs alone, so a resumed run finds the
same jobs under the same ids and each result maps back to its material without
bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from loguru import logger

from ..core.errors import ConfigError, StructureError
from ..core.fields import EXIT_MAX_STEPS, EXIT_MODEL_ERROR, EXIT_QUARANTINED, MODEL_ERROR_KEY
from ..integrators.base import Integrator
from ..integrators.stages import Fused
from ..models.base import Model, cpu_batch_atoms, unsupported_elements

if TYPE_CHECKING:
    import torch

#: Simulator arguments a workflow sets itself (the plan, the stress it reads)
_OWN_ARGUMENTS = ("model", "stages", "stress")


class SinglePoint(Integrator):
    """A stage of no steps: the run's first forward is the job's single point.

    Systems enter and leave at once (exit reason ``completed``); energy, forces and
    stress are those of the input positions.
    """

    def __init__(self) -> None:
        super().__init__(max_steps=0)


@dataclass(frozen=True)
class Job:
    """One structure to evaluate: ``atoms`` of material ``material``, named ``label``."""

    material: int
    label: str
    atoms: Any


@dataclass
class JobRun:
    """What the run gave each job (in job order), and which jobs failed and why."""

    jobs: list[Job]
    results: Any  # alchemi_lit.io.results.Results
    energy: np.ndarray  # [J] eV
    stress: np.ndarray  # [J, 3, 3] eV/Å^3, ASE's sign (positive under tension)
    forces: list[np.ndarray]  # [n_atoms, 3] eV/Å per job
    failures: dict[int, str] = field(default_factory=dict)  # job index -> reason

    def __post_init__(self) -> None:
        self._by_material: dict[int, list[int]] = {}
        for k, job in enumerate(self.jobs):
            self._by_material.setdefault(job.material, []).append(k)

    def of(self, material: int) -> list[int]:
        """Indices of ``material``'s jobs, in the order they were made."""
        return self._by_material.get(material, [])

    def failure(self, material: int) -> str | None:
        """Why ``material``'s jobs cannot be used (the first failed job), or None."""
        bad = [k for k in self.of(material) if k in self.failures]
        if not bad:
            return None
        more = f" (and {len(bad) - 1} more of its jobs)" if len(bad) > 1 else ""
        k = bad[0]
        return f"job {self.jobs[k].label}: {self.failures[k]}{more}"


def as_structures(structures: Any, workflow: str) -> list[Any]:
    """The materials as a list of ``ase.Atoms`` (a path is read with read_structures)."""
    import os

    from ase import Atoms

    if isinstance(structures, (str, os.PathLike)):
        from ..data import read_structures

        structures = read_structures(structures)
    items = [structures] if isinstance(structures, Atoms) else list(structures)
    if not items:
        raise ConfigError(f"{workflow}: no structures given; pass a list of ase.Atoms")
    for i, atoms in enumerate(items):
        if not isinstance(atoms, Atoms):
            raise ConfigError(
                f"{workflow}: structure {i} is a {type(atoms).__name__}, not an ase.Atoms; "
                f"pass ase.Atoms (or a file read_structures reads)"
            )
    return items


def check_materials(structures: Sequence[Any], model: Model, workflow: str) -> None:
    """Refuse, before anything runs, what no job of a bulk property can use: a cell not
    periodic in x, y and z, a flat cell, an invalid structure (NaN, zero masses,
    coincident atoms), constraints, elements the model lacks."""
    from ..core.geometry import periodic_heights
    from ..core.validation import is_element, validate_atoms

    if not isinstance(model, Model):
        raise ConfigError(
            f"{workflow}: model must be an alchemi_lit Model (EMT(), SevenNet() ...), got "
            f"{type(model).__name__}; wrap an ASE calculator with ASECalculatorModel"
        )
    cpu_batch_atoms(model)  # a plugin's bad batch size, before phonopy's set-up
    allowed = model.supported_elements
    lacking: dict[int, list[int]] = {}  # element -> the structures holding it
    for i, atoms in enumerate(structures):
        known = bool(is_element(np.asarray(atoms.numbers)).all())  # (else validation says)
        name = f"{workflow}: structure {i} ({atoms.get_chemical_formula() if known else '?'})"
        if not bool(np.all(atoms.pbc)):
            raise StructureError(
                f"{name} is not periodic in x, y and z (pbc={atoms.pbc.tolist()}); bulk "
                f"properties need a crystal: give it a cell and set atoms.pbc = True",
                i,
            )
        if len(atoms) == 0 or periodic_heights(np.asarray(atoms.cell), atoms.pbc).min() < 1e-3:
            raise StructureError(f"{name} has no atoms or a flat cell; give a 3-D crystal", i)
        try:  # NaN coordinates, zero masses, coincident atoms ...: named as the input
            validate_atoms(atoms, i)
        except StructureError as exc:
            raise StructureError(f"{workflow}: {exc}", i) from exc
        if atoms.constraints:
            raise StructureError(
                f"{name} has constraints ({type(atoms.constraints[0]).__name__}); the "
                f"workflow strains or displaces every atom: del atoms.constraints",
                i,
            )
        for z in set(atoms.numbers.tolist()) - set(allowed) if allowed is not None else ():
            lacking.setdefault(z, []).append(i)  # (all of them named at once, below)
    if lacking:
        first = min(i for ids in lacking.values() for i in ids)
        raise StructureError(
            f"{workflow}: {unsupported_elements(model, lacking, 'structure')}", first
        )


def relax_plan(relax: Any, workflow: str, cell_allowed: Any = None) -> Integrator | Fused | None:
    """The plan each job runs: None (single points), or optimizers that relax the atoms
    (``True``: FIRE to 0.01 eV/Å within 1000 steps).  ``cell_allowed(stage)`` says
    whether a stage relaxing the cell keeps what the workflow imposed (None: never)."""
    if relax is None or relax is False:
        return None
    if relax is True:
        from ..integrators import FIRE

        return FIRE(fmax=0.01, max_steps=1000)
    stages = list(relax.stages) if isinstance(relax, Fused) else [relax]
    for stage in stages:
        if not isinstance(stage, Integrator) or not stage.is_optimizer:
            raise ConfigError(
                f"{workflow}: relax must be True or optimizers (FIRE, BFGS, LBFGS ...), got "
                f"{stage!r}; MD stages do not end at a minimum"
            )
        cell = getattr(stage, "cell", None)
        if cell is not None and not (cell_allowed is not None and cell_allowed(cell)):
            raise ConfigError(
                f"{workflow}: relax stage {stage!r} relaxes the cell, which would undo the "
                f"imposed deformation; relax the atoms only (no cell=)"
            )
    return relax


def run_jobs(
    jobs: list[Job],
    model: Model,
    relax: Integrator | Fused | None,
    workflow: str,
    max_atoms: int | str | None = None,
    max_systems: int | None = None,
    resume: Any = None,
    simulator: dict[str, Any] | None = None,
) -> JobRun:
    """Run every job in one Simulator run (stress in every forward) and collect energy,
    stress, forces and failures per job.  ``simulator``: more Simulator arguments
    (sinks, callbacks, precision, seed, accelerator ...)."""
    from ..data import SizeAwareSampler
    from ..simulator import Simulator

    options = dict(simulator or {})
    clash = [k for k in _OWN_ARGUMENTS if k in options]
    if clash:
        raise ConfigError(
            f"{workflow}: {', '.join(clash)} is set by the workflow (single points or "
            f"relax=, stress always computed); leave it out of the Simulator arguments"
        )
    plan = relax if relax is not None else SinglePoint()
    sim = Simulator(model=model, stages=plan, stress=True, **options)
    atoms = [job.atoms for job in jobs]
    ids = list(range(len(jobs)))
    data: Any = atoms
    if max_atoms is None:
        max_atoms = cpu_chunk_atoms(model, sim.device, atoms)
    if isinstance(max_atoms, int) and max(len(a) for a in atoms) > max_atoms:
        big = max(range(len(jobs)), key=lambda k: len(atoms[k]))
        raise ConfigError(
            f"{workflow}: job {jobs[big].label} of structure {jobs[big].material} has "
            f"{len(atoms[big])} atoms, more than max_atoms={max_atoms}; raise max_atoms"
        )
    if max_atoms is not None:
        data = SizeAwareSampler(atoms, max_atoms=max_atoms, max_systems=max_systems, system_ids=ids)
    n_mat = len({job.material for job in jobs})
    logger.info(f"{workflow}: {len(jobs)} jobs of {n_mat} materials in one run ({plan!r})")
    results = sim.run(data, resume=resume)
    batch = results.batch
    got = [] if batch is None else batch.system_id.tolist()
    if got != ids:
        raise ConfigError(
            f"{workflow}: the run's Results hold {len(got)} of the {len(jobs)} jobs (a "
            f"bounded HostMemory sink kept only some); give sinks an unbounded HostMemory "
            f"or a ZarrSink first"
        )
    return _collect(jobs, batch.to(device="cpu"), results, relax is not None)


def cpu_chunk_atoms(model: Model, device: torch.device, atoms: list[Any]) -> int | None:
    """The default batch budget: on a CPU, the model's ``cpu_batch_atoms`` (raised to
    the largest job), so that an MLIP's single points run in chunks that reuse one
    chunk's memory instead of touching all of the campaign's at once; elsewhere, or for
    a model without one, None (one batch)."""
    hint = cpu_batch_atoms(model)
    if hint is None or device.type != "cpu":
        return None
    return max(hint, max(len(a) for a in atoms))


def _collect(jobs: list[Job], batch: Any, results: Any, relaxed: bool) -> JobRun:
    """Per-job arrays from the results batch (rows are in job order)."""
    import torch

    s = batch.system
    energy = s["energy"].to(torch.float64).numpy()
    stress = s["stress"].to(torch.float64).numpy()
    counts = s["n_atoms"].tolist()
    forces = [f.numpy() for f in torch.split(batch.forces.to(torch.float64), counts)]
    failures: dict[int, str] = {}
    codes, converged = s["exit_code"].tolist(), s["converged"].tolist()
    for k in range(len(jobs)):
        code = codes[k]
        if code == EXIT_MODEL_ERROR:
            text = batch.info.get(k, {}).get(MODEL_ERROR_KEY, "")
            failures[k] = f"the model failed ({text or 'no message'})"
        elif code == EXIT_QUARANTINED or not (
            np.isfinite(energy[k]) and np.isfinite(stress[k]).all()
        ):
            failures[k] = "non-finite energy, forces or stress (NaNGuard quarantined it)"
        elif relaxed and (code == EXIT_MAX_STEPS or not converged[k]):
            failures[k] = (
                "the relaxation did not converge within max_steps; raise max_steps or "
                "loosen fmax of relax="
            )
    return JobRun(jobs, results, energy, stress, forces, failures)


def fresh_atoms(
    numbers: Any, masses: Any, cell: np.ndarray, positions: np.ndarray, info: dict[str, Any]
) -> Any:
    """A job structure: species and masses at new positions and cell, with no results,
    momenta, constraints or earlier run's ``info`` (a result of an earlier run would
    otherwise continue its step count and keep its ``system_id``)."""
    from ase import Atoms

    return Atoms(
        numbers=numbers, positions=positions, cell=cell, pbc=True, masses=masses, info=dict(info)
    )

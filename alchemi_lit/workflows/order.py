"""Orderings of partially occupied structures, ranked by the model's relaxed energy.

For each disordered structure (:mod:`.orderings`): its orderings in the supercell are
enumerated (pymatgen, symmetry-distinct ones kept) when there are at most
``max_enumerate`` of them, else sampled -- random orderings annealed by swap Monte Carlo
(:class:`~alchemi_lit.integrators.SwapMC` stages at falling temperatures, all samples of
all structures in one batched run) and reduced to the distinct ones.  Then the best
``n_relax`` of each (by Ewald energy where the structure has oxidation states, else by
the model's single-point energy, one batched run) are relaxed in ONE batched run
(:func:`~.jobs.run_jobs`, as the property workflows relax) and returned ranked by energy
per atom, with their structures (:class:`~.order_results.OrderResults`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from loguru import logger

from ..core.errors import ConfigError
from ..integrators.stages import Fused
from ..models.base import Model
from . import orderings as od
from .jobs import Job, check_materials, relax_plan, run_jobs
from .order_results import OrderResults

#: annealing temperatures of sampled orderings (K), hottest first
ANNEAL = (2000.0, 1000.0, 600.0, 300.0)


def order(
    structures: Any,
    model: Model,
    *,
    supercell: Any = None,
    max_enumerate: int = 2000,
    method: Literal["auto", "enumerate", "sample"] = "auto",
    n_samples: int = 64,
    anneal: Sequence[float] = ANNEAL,
    anneal_steps: int = 200,
    n_relax: int = 8,
    relax: Any = True,
    max_atoms: int | str | None = None,
    max_systems: int | None = None,
    resume: Any = None,
    seed: int = 0,
    **simulator: Any,
) -> OrderResults:
    """Find the low-energy orderings of partially occupied structures in one batched run.

    Args:
        structures: pymatgen ``Structure`` objects with partial occupancies, or paths of
            CIFs with them (a list, or one).
        model: any alchemi_lit model.
        supercell: the cell the orderings live in: None (as given), an integer, three
            integers or a 3x3 matrix; it must make whole numbers of each species.
        max_enumerate: enumerate when a structure has at most this many orderings (its
            exact count, known before anything runs); above it ``method="auto"`` samples.
        method: ``"auto"``, ``"enumerate"`` (above ``max_enumerate``: an error) or
            ``"sample"`` (always sample).
        n_samples: random orderings per structure when sampling.
        anneal: temperatures (K, hottest first) of the swap Monte Carlo annealing of
            sampled orderings, ``anneal_steps`` attempts each; ``()``: no annealing.
        n_relax: orderings per structure relaxed (the best by the pre-screen).
        relax: ``True`` (FIRE to 0.01 eV/Å, atoms only), optimizers, or None (single
            points: ranked unrelaxed).
        max_atoms, max_systems: inflight batching budgets of the runs.
        resume: continue an interrupted relaxation run (as ``Simulator.run``).
        seed: the sampling's and the Monte Carlo's seed.
        **simulator: more Simulator arguments (precision, callbacks, sinks ...); sinks
            and callbacks serve the relaxation run, not the annealing or pre-screen.
    """
    if method not in ("auto", "enumerate", "sample"):
        raise ConfigError(
            f"order: method must be 'auto', 'enumerate' or 'sample', got {method!r}"
        )
    counted = {"max_enumerate": max_enumerate, "n_samples": n_samples, "n_relax": n_relax,
               "anneal_steps": anneal_steps}  # fmt: skip
    for name, value in counted.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"order: {name} must be an integer >= 1, got {value!r}")
    inputs = od.as_disordered(structures)
    cells = [od.supercell_of(s, supercell) for s in inputs]
    counts = [od.count_orderings(c, i) for i, c in enumerate(cells)]
    sampled = [method == "sample" or (method == "auto" and n > max_enumerate) for n in counts]
    for i, n in enumerate(counts):
        if method == "enumerate" and n > max_enumerate:
            raise ConfigError(
                f"order: structure {i} ({inputs[i].composition.reduced_formula}) has {n} "
                f"orderings in a {len(cells[i])}-site supercell, more than max_enumerate="
                f"{max_enumerate}; sample them (method='sample' or 'auto'), use a smaller "
                f"supercell, or raise max_enumerate"
            )
    relax = relax_plan(relax, "order")
    candidates: list[list[tuple[Any, float]]] = []
    for i, cell in enumerate(cells):
        if sampled[i]:
            logger.info(
                f"order: structure {i} has {counts[i]} orderings in its {len(cell)}-site "
                f"supercell: sampling {n_samples} (max_enumerate={max_enumerate})"
            )
            found = [(s, float("nan")) for s in od.random_orderings(cell, n_samples, seed + i)]
        else:
            found = od.enumerate_orderings(cell, counts[i])
        candidates.append(found)
    _check(candidates, model)
    options = {"seed": seed, **simulator}
    # (the annealing and the pre-screen are not the run the sinks and checkpoints are for)
    helper = {k: v for k, v in options.items() if k not in ("sinks", "callbacks")}
    annealed = _anneal(candidates, sampled, cells, model, anneal, anneal_steps, helper)
    chosen = _prescreen(annealed, model, n_relax, max_atoms, max_systems, helper)
    jobs = [Job(i, f"{i}:{k}", od.to_atoms(s)) for i, picks in enumerate(chosen)
            for k, (s, _) in enumerate(picks)]  # fmt: skip
    run = run_jobs(jobs, model, relax, "order", max_atoms, max_systems, resume, options)
    settings = {"supercell": supercell, "max_enumerate": max_enumerate, "method": method,
                "n_samples": n_samples, "anneal": list(anneal), "anneal_steps": anneal_steps,
                "n_relax": n_relax, "relax": repr(relax), "seed": seed}  # fmt: skip
    found = [len(c) for c in annealed]
    return OrderResults(inputs, chosen, run, counts, found, sampled, settings)


def _check(candidates: list[list[tuple[Any, float]]], model: Model) -> None:
    """The orderings are crystals the model can evaluate (named by structure)."""
    firsts = [od.to_atoms(c[0][0]) for c in candidates]
    check_materials(firsts, model, "order")


def _anneal(
    candidates: list[list[tuple[Any, float]]], sampled: list[bool], cells: list[Any],
    model: Model, temperatures: Sequence[float], steps: int, options: dict[str, Any],
) -> list[list[tuple[Any, float]]]:  # fmt: skip
    """Sampled orderings annealed by swap Monte Carlo among the species that occupy only
    disordered sites (one run per such set of species), then the distinct ones kept."""
    from pymatgen.analysis.structure_matcher import StructureMatcher
    from pymatgen.io.ase import AseAtomsAdaptor

    from ..integrators import SwapMC
    from ..simulator import Simulator

    out = list(candidates)
    runs: dict[tuple[str, ...], list[int]] = {}
    for i, cell in enumerate(cells):
        if sampled[i] and temperatures:
            species = _swappable(cell)
            if len(species) >= 2:
                runs.setdefault(species, []).append(i)
    for species, members in runs.items():
        plan = Fused([SwapMC(list(species), temperature=t, steps=steps) for t in temperatures])
        atoms = [od.to_atoms(s) for i in members for s, _ in candidates[i]]
        results = Simulator(model, plan, **options).run(atoms)
        done = iter(results.to_atoms())
        for i in members:
            out[i] = [(AseAtomsAdaptor.get_structure(next(done)), float("nan"))
                      for _ in candidates[i]]  # fmt: skip
    for i in range(len(out)):
        if sampled[i]:
            groups = StructureMatcher().group_structures([s for s, _ in out[i]])
            out[i] = [(g[0], float("nan")) for g in groups]
    return out


def _swappable(cell: Any) -> tuple[str, ...]:
    """Elements found on disordered sites and nowhere else (a swap among them keeps
    every sublattice's composition)."""
    mixed = {str(e) for site in cell if not site.is_ordered for e in site.species}
    fixed = {str(e) for site in cell if site.is_ordered for e in site.species}
    return tuple(sorted(mixed - fixed))


def _prescreen(
    candidates: list[list[tuple[Any, float]]], model: Model, n_relax: int,
    max_atoms: Any, max_systems: Any, options: dict[str, Any],
) -> list[list[tuple[Any, float]]]:  # fmt: skip
    """The ``n_relax`` best of each structure: by Ewald energy where it is known (an
    enumeration with oxidation states), else by the model's single-point energy per
    atom (all structures' candidates in one batched run)."""
    chosen: list[list[tuple[Any, float]]] = [[] for _ in candidates]
    screen: list[Job] = []
    for i, found in enumerate(candidates):
        ewald = [e for _, e in found]
        if len(found) <= n_relax:
            chosen[i] = found
        elif all(np.isfinite(ewald)) and len(set(ewald)) > 1:
            chosen[i] = sorted(found, key=lambda p: p[1])[:n_relax]
        else:
            screen += [Job(i, f"{i}:{k}", od.to_atoms(s)) for k, (s, _) in enumerate(found)]
    if screen:
        points = run_jobs(screen, model, None, "order", max_atoms, max_systems, None, options)
        per_atom = {job.label: points.energy[k] / len(job.atoms) for k, job in enumerate(screen)}
        for i, found in enumerate(candidates):
            if not chosen[i]:
                order_ = sorted(range(len(found)), key=lambda k: per_atom[f"{i}:{k}"])
                chosen[i] = [found[k] for k in order_[:n_relax]]
    return chosen

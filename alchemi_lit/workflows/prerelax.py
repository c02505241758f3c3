"""The pre-relaxation of a property workflow: the input crystals relaxed (cell and
atoms) before their strained or displaced jobs, by default keeping their symmetry.

Why here and symmetry-preserving: an elastic tensor is the tangent at zero stress and
phonons need forces near zero, so the structures must be relaxed first; relaxed freely,
a crystal whose symmetric configuration is a saddle (or whose noise grows along a soft
mode) leaves its space group, and its tensor or bands then describe another material.
ASE's ``FixSymmetry`` (:mod:`alchemi_lit.core.symmetrize`) keeps the group, as
materials workflows do before elastic constants and phonons.  Each material's space
group before and after is recorded (``spacegroup_initial``, ``spacegroup_final``,
``symmetry``: the results table's verdict), so the workflow's table says what held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.errors import ConfigError
from ..integrators.base import Integrator
from ..integrators.stages import Fused
from ..models.base import Model

#: the columns a pre-relaxation adds to a workflow's table
COLUMNS = ("spacegroup_initial", "spacegroup_final", "symmetry", "prerelax_converged")


def prerelax_plan(prerelax: Any, workflow: str) -> Integrator | Fused | None:
    """``prerelax=``: None/False (none), True (FIRE on a Frechet cell filter to 0.01 eV/Å
    within 1000 steps), or optimizers that relax the cell."""
    if prerelax is None or prerelax is False:
        return None
    if prerelax is True:
        from ..integrators import FIRE

        return FIRE(fmax=0.01, max_steps=1000, cell="frechet")
    stages = list(prerelax.stages) if isinstance(prerelax, Fused) else [prerelax]
    for stage in stages:
        if not isinstance(stage, Integrator) or not stage.is_optimizer:
            raise ConfigError(
                f"{workflow}: prerelax must be True or optimizers (FIRE, BFGS ... with "
                f"cell='frechet'), got {stage!r}"
            )
    if all(getattr(s, "cell", None) is None for s in stages):
        raise ConfigError(
            f"{workflow}: prerelax {prerelax!r} relaxes no cell; give an optimizer with "
            f"cell='frechet' (the jobs need zero stress), or prerelax=True"
        )
    return prerelax


def prerelax(
    materials: Sequence[Any],
    model: Model,
    plan: Integrator | Fused | None,
    fix_symmetry: bool,
    symprec: float,
    workflow: str,
    simulator: dict[str, Any],
) -> tuple[list[Any], list[dict[str, Any]] | None]:
    """The structures the jobs start from and, where a pre-relaxation ran, each one's
    space groups and convergence (:data:`COLUMNS`).  One batched run; its Simulator
    arguments are the workflow's (``sinks``, ``callbacks`` ... apply to the jobs only)."""
    if plan is None:
        return list(materials), None
    from ..core.symmetry import fix_symmetry as constrain
    from ..simulator import Simulator

    options = {k: v for k, v in simulator.items() if k in ("precision", "seed", "accelerator")}
    start = constrain(materials, symprec=symprec) if fix_symmetry else list(materials)
    results = Simulator(model=model, stages=plan, **options).run(start)
    table = results.to_pandas()
    relaxed = []
    for atoms, original in zip(results.to_atoms(), materials):
        atoms.set_constraint()  # (the jobs strain and displace every atom)
        atoms.calc = None
        atoms.info = dict(original.info)
        relaxed.append(atoms)
    rows = [
        {
            "spacegroup_initial": int(row.spacegroup_initial),
            "spacegroup_final": int(row.spacegroup_final),
            "symmetry": str(row.symmetry),
            "prerelax_converged": bool(row.converged),
        }
        for row in table.itertuples()
    ]
    return relaxed, rows


__all__ = ["COLUMNS", "prerelax", "prerelax_plan"]

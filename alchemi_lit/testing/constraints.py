"""ASE constraint sets of every kind the framework applies, for tests of integrators,
stores and pipelines with constraints.

Why shipped: each kind reaches the step through its own path (a mask, a projection, a
force term, RATTLE), so a third-party integrator's tests, like this project's, should
run every kind and a mix of them rather than only ``FixAtoms``.
"""

from __future__ import annotations

from collections.abc import Callable

from ase import Atoms
from ase.constraints import (
    ExternalForce,
    FixAtoms,
    FixBondLengths,
    FixCartesian,
    FixCom,
    FixedLine,
    FixedPlane,
    Hookean,
)

#: the smallest structure the cases index into (atoms 0..11)
MIN_ATOMS = 12


def constraint_cases() -> dict[str, Callable[[Atoms], list]]:
    """Name -> a function of a structure (≥ :data:`MIN_ATOMS` atoms) giving a list of
    ASE constraints for it: one per kind (``FixAtoms``, ``FixCartesian`` of some axes,
    ``FixedPlane``, ``FixedLine``, ``FixCom``, ``FixBondLengths``, ``Hookean`` of all
    three forms, ``ExternalForce``), then ``"mixed"``: five kinds on one structure."""
    return {
        "FixAtoms": lambda a: [FixAtoms([0, 4])],
        "FixCartesian": lambda a: [FixCartesian([0, 3, 5], mask=(True, False, True))],
        "FixedPlane": lambda a: [FixedPlane([1, 2, 7], direction=(1.0, 2.0, -0.5))],
        "FixedLine": lambda a: [FixedLine([4, 6], direction=(0.3, -1.0, 0.2))],
        "FixCom": lambda a: [FixCom()],
        "FixBondLengths": lambda a: [FixBondLengths([(0, 1), (2, 3), (5, 6)])],
        "Hookean": lambda a: [  # two atoms, an atom and a point, an atom and a plane
            Hookean(0, 9, k=3.0, rt=3.0),
            Hookean(2, a.positions[2] + (0.4, 0.1, 0.0), k=2.0, rt=0.1),
            Hookean(5, (0.0, 0.0, 1.0, -a.positions[5, 2] + 0.05), k=4.0),
        ],
        "ExternalForce": lambda a: [ExternalForce(3, 11, 0.05)],
        "mixed": lambda a: [
            ExternalForce(3, 11, 0.02),
            Hookean(0, 9, k=3.0, rt=3.0),
            FixAtoms([8]),
            FixCartesian([1], mask=(False, False, True)),
            FixedPlane([2], (0, 1, 0)),
        ],
    }


__all__ = ["MIN_ATOMS", "constraint_cases"]

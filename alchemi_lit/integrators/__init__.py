"""Integrator plugins: optimizers and molecular-dynamics methods.

The plugin contract is :class:`Integrator` (:mod:`.base`; MD methods: :class:`MDIntegrator`),
the steps integrators are made of are in :mod:`.ops`, parameter checks in :mod:`.params`.
"""

from . import ops
from .base import FieldSpec, Integrator
from .berendsen import Berendsen
from .bfgs import BFGS
from .bussi import Bussi
from .cell import CellFilter
from .fire import FIRE
from .fire2 import FIRE2
from .langevin import Langevin
from .lbfgs import LBFGS
from .md import MDIntegrator
from .nose_hoover import NoseHooverChain
from .ops import maxwell_boltzmann
from .params import as_param, check_count, check_param, check_positive, check_range
from .verlet import VelocityVerlet

__all__ = [
    "BFGS",
    "FIRE",
    "FIRE2",
    "LBFGS",
    "Berendsen",
    "Bussi",
    "CellFilter",
    "FieldSpec",
    "Integrator",
    "Langevin",
    "MDIntegrator",
    "NoseHooverChain",
    "VelocityVerlet",
    "as_param",
    "check_count",
    "check_param",
    "check_positive",
    "check_range",
    "maxwell_boltzmann",
    "ops",
]

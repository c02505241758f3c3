"""Integrator plugins: optimizers and molecular-dynamics methods."""

from .base import FieldSpec, Integrator, MDIntegrator, maxwell_boltzmann
from .berendsen import Berendsen
from .bfgs import BFGS
from .bussi import Bussi
from .cell import CellFilter
from .fire import FIRE
from .fire2 import FIRE2
from .langevin import Langevin
from .lbfgs import LBFGS
from .nose_hoover import NoseHooverChain
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
    "maxwell_boltzmann",
]

"""Integrator plugins: optimizers and molecular-dynamics methods."""

from .base import FieldSpec, Integrator, MDIntegrator, maxwell_boltzmann
from .berendsen import Berendsen
from .bussi import Bussi
from .fire import FIRE
from .fire2 import FIRE2
from .langevin import Langevin
from .nose_hoover import NoseHooverChain
from .verlet import VelocityVerlet

__all__ = [
    "FIRE",
    "FIRE2",
    "Berendsen",
    "Bussi",
    "FieldSpec",
    "Integrator",
    "Langevin",
    "MDIntegrator",
    "NoseHooverChain",
    "VelocityVerlet",
    "maxwell_boltzmann",
]

"""Integrator plugins: optimizers, molecular-dynamics methods and Monte Carlo moves.

The plugin contract is :class:`Integrator` (:mod:`.base`; MD methods: :class:`MDIntegrator`),
the steps integrators are made of are in :mod:`.ops`, parameter checks in :mod:`.params`.
"""

from ..core.schedule import Ramp
from . import exchange, ops
from .base import FieldSpec, Integrator
from .berendsen import Berendsen
from .bfgs import BFGS
from .bussi import Bussi
from .cell import CellFilter
from .crescale import CRescale
from .fire import FIRE
from .fire2 import FIRE2
from .hybrid import Hybrid
from .ladder import geometric_ladder
from .langevin import Langevin
from .lbfgs import LBFGS
from .md import MDIntegrator
from .mtk import MTKNPT
from .neb import NEB
from .nose_hoover import NoseHooverChain
from .npt_langevin import NPTLangevin
from .params import as_param, check_count, check_param, check_positive, check_range
from .sgc_mc import SemiGrandMC
from .swap_mc import SwapMC
from .tempering import ReplicaExchange
from .velocities import maxwell_boltzmann
from .verlet import VelocityVerlet

__all__ = [
    "BFGS",
    "FIRE",
    "FIRE2",
    "LBFGS",
    "MTKNPT",
    "NEB",
    "Berendsen",
    "Bussi",
    "CRescale",
    "CellFilter",
    "FieldSpec",
    "Hybrid",
    "Integrator",
    "Langevin",
    "MDIntegrator",
    "NPTLangevin",
    "NoseHooverChain",
    "Ramp",
    "ReplicaExchange",
    "SemiGrandMC",
    "SwapMC",
    "VelocityVerlet",
    "as_param",
    "check_count",
    "check_param",
    "check_positive",
    "check_range",
    "exchange",
    "geometric_ladder",
    "maxwell_boltzmann",
    "ops",
]

"""Interatomic models: the Model base class, built-in potentials and neighbour lists."""

from .ase_calculator import ASECalculatorModel
from .base import Model
from .emt import EMT
from .neighbors import Edges, NeighborList
from .pair import LennardJones, Morse

__all__ = ["EMT", "ASECalculatorModel", "Edges", "LennardJones", "Model", "Morse", "NeighborList"]

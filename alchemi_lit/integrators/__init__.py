"""Integrator plugins: optimizers and molecular-dynamics methods."""

from .base import FieldSpec, Integrator, MDIntegrator, maxwell_boltzmann
from .fire import FIRE
from .verlet import VelocityVerlet

__all__ = ["FIRE", "FieldSpec", "Integrator", "MDIntegrator", "VelocityVerlet", "maxwell_boltzmann"]

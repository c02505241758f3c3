"""Structure input (ASE formats), built-in structure sets and samplers."""

from .builtin import BUILTIN_SETS, argon_crystals, mixed_argon
from .io import read_structures
from .sampler import SizeAwareSampler

__all__ = ["BUILTIN_SETS", "SizeAwareSampler", "argon_crystals", "mixed_argon", "read_structures"]

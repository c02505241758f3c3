"""Structure input (ASE formats, read eagerly or streamed), built-in sets and samplers."""

from .builtin import BUILTIN_SETS, argon_crystals, mixed_argon
from .datasets import StructureDataset, Subset
from .io import read_structures
from .open_dataset import open_dataset
from .replicas import make_replicas
from .sampler import SizeAwareSampler

__all__ = [
    "BUILTIN_SETS",
    "SizeAwareSampler",
    "StructureDataset",
    "Subset",
    "argon_crystals",
    "make_replicas",
    "mixed_argon",
    "open_dataset",
    "read_structures",
]

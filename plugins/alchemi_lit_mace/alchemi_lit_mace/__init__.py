"""alchemi_lit plugin: MACE (``mace-torch``) models from your own model file, batched.

Importing this module registers the model class ``MACE`` and two presets,
``mace-mp-small-random`` and ``mace-mp-medium-random`` (random weights in the MACE-MP-0
architecture, for throughput benchmarks), with alchemi_lit's registry; alchemi_lit
imports it through the ``alchemi_lit.plugins`` entry point.  ``mace`` itself is imported
only when a model is built (it is slow to import), and then under a guard that restores
the environment variable mace sets to weaken ``torch.load`` (see :mod:`._imports`).
"""

from __future__ import annotations

from alchemi_lit.core.registry import register, register_preset

from ._imports import mace_import_guard, preserved_environ
from .checkpoint import SAFE_FORMAT, UnsafeCheckpointError, load_model, save_checkpoint
from .model import MACE, MP_ARCHITECTURE, MP_ELEMENTS, build_mace_mp, num_parameters

register("model")(MACE)
register_preset("model", "mace-mp-small-random", MACE, random_init="small")
register_preset("model", "mace-mp-medium-random", MACE, random_init="medium")

__version__ = "0.1.0"
__all__ = [
    "MACE",
    "MP_ARCHITECTURE",
    "MP_ELEMENTS",
    "SAFE_FORMAT",
    "UnsafeCheckpointError",
    "build_mace_mp",
    "load_model",
    "mace_import_guard",
    "num_parameters",
    "preserved_environ",
    "save_checkpoint",
]

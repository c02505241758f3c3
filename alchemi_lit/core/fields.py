"""The names, kinds and dtypes of a Batch's core fields, exit codes and info keys.

Kept apart from :mod:`alchemi_lit.core.state` so that the ASE conversion and the results
readers can use them without importing the Batch (no import circles).
"""

from __future__ import annotations

from typing import Literal

import torch

FieldKind = Literal["atom", "system"]

#: Core per-atom fields and their dtype class ("float" follows the batch precision).
ATOM_FIELDS: dict[str, str] = {
    "positions": "float",
    "velocities": "float",
    "forces": "float",
    "masses": "float",
    "atomic_numbers": "int64",
    "system_idx": "int64",
    "fixed": "bool",
    "tags": "int64",
}

#: Core per-system fields.  ``energy`` is NaN until a model has evaluated the system.
SYSTEM_FIELDS: dict[str, str] = {
    "cell": "float",
    "pbc": "bool",
    "energy": "float",
    "stress": "float",
    "n_atoms": "int64",
    "system_id": "int64",
    "status": "int64",
    "step": "int64",
    "total_steps": "int64",
    "converged": "bool",
    "exit_code": "int64",
}

#: Exit codes recorded per system in ``exit_code``.
EXIT_RUNNING = 0
EXIT_CONVERGED = 1
EXIT_MAX_STEPS = 2
EXIT_COMPLETED = 3
EXIT_QUARANTINED = 4
EXIT_MODEL_ERROR = 5
EXIT_REASONS = {
    EXIT_RUNNING: "running",
    EXIT_CONVERGED: "converged",
    EXIT_MAX_STEPS: "max_steps",
    EXIT_COMPLETED: "completed",
    EXIT_QUARANTINED: "non_finite",
    EXIT_MODEL_ERROR: "model_error",
}
#: Exits for a failure (non-finite values, a model error): quarantined, never converged
#: (on host records; ``engine.status.failed_exit`` is the per-step tensor test).
FAILED_EXITS = (EXIT_QUARANTINED, EXIT_MODEL_ERROR)

#: ``info`` key under which a system's other per-atom ``ase.Atoms.arrays``
#: (``initial_magmoms``, ``initial_charges``, extxyz columns ...) travel, as numpy arrays:
#: info already goes everywhere a system goes (transfer messages, checkpoints, zarr).
ARRAYS_KEY = "__arrays__"
#: ``ase.Atoms.arrays`` that are core batch fields rather than carried in info.
CORE_ARRAYS = frozenset({"numbers", "positions", "masses", "momenta", "tags"})
#: ``info`` keys :meth:`Batch.to_atoms` writes with ``results=True`` (and ``stage_energy``
#: where the batch has it); an input value under one of them moves to ``input_<key>``,
#: never silently replaced.
RESULT_INFO_KEYS = ("system_id", "status", "steps", "converged", "exit_reason")
#: ``info`` key holding why a quarantined system failed (the model's exception); named
#: so it cannot be mistaken for a user's own ``error`` key.
MODEL_ERROR_KEY = "model_error"


def count_dtype(kind: str, float_dtype: torch.dtype) -> torch.dtype:
    """The dtype of a field of dtype class ``kind`` in a batch of ``float_dtype``."""
    return {"float": float_dtype, "int64": torch.int64, "bool": torch.bool}[kind]

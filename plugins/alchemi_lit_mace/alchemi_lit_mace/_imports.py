"""Import mace without letting it weaken torch's safe loading for the whole process.

Why: ``import mace`` (and ``import mace.calculators``) executes
``os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"``.  torch reads that variable at
every ``torch.load`` call, so from then on every load in the process that does not pass
``weights_only`` explicitly -- the framework's checkpoints included -- would silently
unpickle arbitrary objects.  mace does it so that e3nn 0.4 can load its own constants
file at import (that file holds ``slice`` objects, which the ``weights_only=True``
default rejects).

Here mace is imported with a snapshot of ``os.environ`` that is restored right after,
and with ``slice`` -- inert data -- allowlisted for the duration of the import so that
e3nn's constants load safely whichever of e3nn and mace is imported first.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType

import torch


@contextlib.contextmanager
def preserved_environ() -> Iterator[None]:
    """Restore ``os.environ`` exactly (values changed, added or removed) on exit."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@contextlib.contextmanager
def mace_import_guard() -> Iterator[None]:
    """Context for importing anything from ``mace`` (see module docstring)."""
    with preserved_environ(), torch.serialization.safe_globals([slice]):
        yield


def import_mace() -> ModuleType:
    """``mace.modules`` (with ``mace.tools``), imported under :func:`mace_import_guard`."""
    with mace_import_guard():
        import mace
        import mace.modules
        import mace.tools.scripts_utils
    return mace.modules

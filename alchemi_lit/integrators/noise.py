"""Integrators' keyed noise: the standard normals of an integrator's current step.

Each number is a function of (run seed, ``system_id``, the system's total step count,
purpose, atom index) (:mod:`alchemi_lit.core.random`), so a system's noise does not depend on
the batch it runs in.  What draws them is per integrator and kept here, not on the
integrator (which stays a plain, picklable description): on CPU a
:class:`~alchemi_lit.core.random.NormalsAhead` drawing several steps at once, after
:meth:`~.base.Integrator.compile` the kernel compiled by ``torch.compile``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..core import random as rng
from ..core.state import Batch


class NoiseStream(Protocol):
    """Whose keyed noise is drawn: an integrator (its run's ``seed``; after
    :meth:`~.base.Integrator.compile` the draw runs through ``torch.compile``)."""

    seed: int
    compiled_kernels: bool


_sources: weakref.WeakKeyDictionary[Any, rng.NormalsAhead] = weakref.WeakKeyDictionary()


def noise_source(stream: NoiseStream) -> Callable[..., torch.Tensor]:
    """What draws ``stream``'s normals: the compiled kernel after its ``compile()``, else
    its own :class:`~alchemi_lit.core.random.NormalsAhead` (the same numbers)."""
    if stream.compiled_kernels:
        return rng.compiled_atom_normals()
    try:
        source = _sources.get(stream)
        if source is None:
            source = _sources[stream] = rng.NormalsAhead()
    except TypeError:  # neither hashable nor weakly referable: a draw per call
        return rng.atom_normals
    return source


def noise_keys(batch: Batch, seed: int, purpose: int) -> tuple[Any, ...]:
    """The arguments of :func:`~alchemi_lit.core.random.atom_normals` for this step."""
    return (
        seed, batch.system_id, batch.total_steps, batch.system_idx,
        batch.segments.local_index, purpose, batch.dtype,
    )  # fmt: skip


def normals(batch: Batch, stream: NoiseStream, purpose: int) -> torch.Tensor:
    """Standard normals ``[N, 3]`` for this step, keyed by (run seed, ``system_id``, the
    system's total step count, ``purpose``, atom index): the same for a system wherever
    and with whomever it runs (:mod:`alchemi_lit.core.random`)."""
    return noise_source(stream)(*noise_keys(batch, stream.seed, purpose))

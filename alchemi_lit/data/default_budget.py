"""The batch budget of a run that names none: never one batch of everything.

One batch of all the structures of a campaign file is what ran a machine out of memory
with no result kept (issue 46; docs/design/50-a-run-without-a-budget-is-bounded.md).  A
run without a budget therefore gets a :class:`~alchemi_lit.data.SizeAwareSampler`
whose budget is measured where measuring is reliable -- ``max_atoms="auto"`` on a CUDA
device with the single strategy (the caching allocator's peaks are exact; a model
whose memory it cannot see falls back to the bounded budget) -- and bounded otherwise:
on a CPU a batch past a few thousand atoms is no faster per atom (a model's
``cpu_batch_atoms`` where it states one), and the pipeline and replicas strategies
cannot measure.  The choice is logged, so a user sees which it was and how to set
their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loguru import logger

from .sampler import SizeAwareSampler

#: atoms in flight of a run without a budget where it is not measured: small models
#: (EMT, LJ: ~1 kB an atom with neighbour lists) use tens of MB, and an MLIP on a GPU
#: (~100 kB an atom) about a GB, which any device holds
BOUNDED_MAX_ATOMS = 8192


def default_budget_sampler(
    dataset: Sequence[Any],
    device_type: str,
    measurable: bool,
    cpu_batch_atoms: int | None = None,
    system_ids: Sequence[int] | None = None,
    shard: str | tuple[int, int] | None = None,
) -> SizeAwareSampler:
    """The sampler of a run without a budget: ``max_atoms="auto"`` on CUDA when the
    strategy can measure (``measurable``), else a bounded budget -- ``cpu_batch_atoms``
    (the model's own CPU batch size) on a CPU where the model states one, else
    :data:`BOUNDED_MAX_ATOMS` -- raised to the largest structure or band, which must
    run in one batch.  Logs which it chose and how to choose otherwise."""
    sampler = SizeAwareSampler(dataset, "auto", system_ids=system_ids, shard=shard)
    how = "set data.sampler.max_atoms (CLI) or pass a SizeAwareSampler to choose"
    largest = max(
        [int(sampler.sizes.max())] + [int(sampler.sizes[a:b].sum()) for _, a, b in sampler.bands]
    )
    if device_type == "cuda" and measurable:
        sampler.fallback_atoms = max(BOUNDED_MAX_ATOMS, largest)  # (a model memory unseen)
        logger.info(
            f"no batch budget given: max_atoms='auto', measured on the device before the "
            f"run ({len(sampler)} structures, {int(sampler.sizes.sum())} atoms); {how}"
        )
        return sampler
    hint = cpu_batch_atoms if device_type == "cpu" and cpu_batch_atoms else None
    bound = hint or BOUNDED_MAX_ATOMS
    chosen = max(bound, largest)
    why = (
        f"the model's cpu_batch_atoms={hint}"
        if hint
        else "a bounded default (not measured: "
        + (
            "the CPU gains nothing from larger batches"
            if device_type == "cpu"
            else "this strategy cannot measure"
        )
        + ")"
    )
    raised = (
        f", raised to the largest structure or band ({largest} atoms)" if largest > bound else ""
    )
    logger.info(
        f"no batch budget given: max_atoms={chosen}, {why}{raised}; {len(sampler)} "
        f"structures, {int(sampler.sizes.sum())} atoms, in inflight batches; {how}"
    )
    return sampler.with_budget(chosen)

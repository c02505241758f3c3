"""Replica exchange (parallel tempering) as a stage that wraps a thermostat.

Why a wrapper integrator, not a callback or a strategy: an exchange needs the energies
of every replica of a group *at the same step*, and a stage's ``post_update`` runs right
after the one forward that gave them, for all of its systems at once.  What it keeps
(rungs, temperatures, pair counts, round trips) are batch fields like any integrator's,
so checkpoints, resume, packing across ranks and batch independence hold with no code of
their own; a callback would keep that state outside the batch, and a strategy would
have to re-implement the step.  The replicas of a group are ordinary systems (copies
made by :func:`~alchemi_lit.data.replicas.make_replicas`, sharing
``info["replica_group"]``), which the sampler takes whole, as it takes a band.

The wrapped stage (a thermostat, swap Monte Carlo, or a Hybrid of both) reads each
system's temperature from the batch field ``rex_temperature`` (:class:`~.params.Rows`),
so exchanging temperatures between two rows is a write of two numbers; the move itself
is :mod:`.exchange`.  (The attribute keeps the name ``md`` for a Monte Carlo stage too.)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from ..core.errors import ConfigError
from ..core.state import Batch
from ..core.tensor_ops import on_device
from ..data.replicas import group_rows
from . import exchange
from .base import Integrator
from .bussi import Bussi
from .hybrid import Hybrid
from .ladder import check_ladder
from .langevin import Langevin
from .nose_hoover import NoseHooverChain
from .params import Rows, check_count
from .swap_mc import SwapMC

#: stages that sample the canonical ensemble at their temperature (what the acceptance
#: assumes): thermostats and swap Monte Carlo
CANONICAL = (Langevin, Bussi, NoseHooverChain, SwapMC)


def tempered(owner: str, stage: Integrator) -> Integrator:
    """A copy of ``stage`` whose temperature is each row's ``rex_temperature`` (a
    :class:`Hybrid`: its MD and MC parts both); a stage that does not sample the
    canonical ensemble at its temperature is refused."""
    if isinstance(stage, Hybrid):
        inner = copy.copy(stage)
        inner.md, inner.mc = tempered(owner, stage.md), tempered(owner, stage.mc)
        return inner
    if not isinstance(stage, CANONICAL):
        names = ", ".join(c.__name__ for c in CANONICAL)
        raise ConfigError(
            f"{owner}: the stage must sample the canonical ensemble at its temperature "
            f"({names}, or a Hybrid of them), got {stage!r}; the exchange acceptance assumes "
            f"it (NVE, Berendsen, barostats and SemiGrandMC's chemical potentials do not)"
        )
    if getattr(stage, "proposals", 1) > 1:
        raise ConfigError(
            f"{owner}: {stage!r} has proposals > 1, whose chains (groups of copies) cannot "
            f"also be replicas of a temperature ladder; use proposals=1 under ReplicaExchange"
        )
    inner = copy.copy(stage)
    inner.temperature = Rows(exchange.TEMPERATURE)
    return inner


class ReplicaExchange(Integrator):
    """Parallel tempering: ``stage`` at a ladder of temperatures, one replica per rung,
    exchanges between neighbours every ``every`` steps (see :mod:`.exchange`).

    Args:
        stage: a canonical thermostat (Langevin, Bussi, NoseHooverChain), swap Monte
            Carlo (SwapMC) or a Hybrid of the two; its own ``temperature`` is replaced by
            the ladder, its ``steps`` is the stage's.
        temperatures: the ladder in K, strictly increasing, at least 2 (one per replica).
        every: steps between exchange attempts (>= 1); even and odd pairs alternate.

    Neighbours exchange when both are at the same step of the stage and of the run
    (``total_steps``): replicas that enter it together, as the identical copies of
    ``make_replicas`` do after a relaxation; members that left it at different steps
    never pair, on one device as across pipeline ranks (where the first ones wait).
    """

    budget_name = "steps"

    def __init__(self, stage: Integrator, temperatures: Sequence[float], every: int = 100) -> None:
        owner = type(self).__name__
        self.md = tempered(owner, stage)
        self._ladder = torch.tensor(check_ladder(owner, temperatures), dtype=torch.float64)
        self.every = check_count(owner, "every", every, 1, "steps between exchange attempts")
        super().__init__(stage.max_steps)
        self.fields = dict(stage.fields)  # (the stage's own: stage-private)
        self.requires_stress = getattr(stage, "requires_stress", False)

    @property
    def temperatures(self) -> list[float]:
        """The ladder (K), lowest first."""
        return self._ladder.tolist()

    @property
    def steps(self) -> int:
        return self.max_steps

    def __repr__(self) -> str:
        t = self.temperatures
        rungs = f"{len(t)} replicas {t[0]:g}-{t[-1]:g} K"
        return f"ReplicaExchange({self.md!r}, {rungs}, every={self.every})"

    def compile(self) -> None:
        super().compile()
        self.md.compile()

    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        self.seed = int(seed)
        self.md.setup(batch, seed, prefix)
        self.declare(batch)

    def declare(self, batch: Batch) -> None:
        """The replica fields (kept with the results) and each new system's group and rung
        from its ``info``, all of a group in the batch (the sampler takes it whole); a
        pipeline's other ranks declare them too, so a group crosses ranks whole."""
        n = len(self._ladder)
        exchange.declare(batch, n)
        group, rung = getattr(batch, exchange.GROUP).clone(), getattr(batch, exchange.RUNG).clone()
        for g, rows in group_rows(batch, group < 0, n, type(self).__name__).items():
            for r, k in rows:
                group[r], rung[r] = g, k
        setattr(batch, exchange.GROUP, group)
        setattr(batch, exchange.RUNG, rung)

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        """Replicas entering: the temperature of their rung, counts at zero, then the
        thermostat's own entry (Maxwell-Boltzmann velocities at that temperature)."""
        exchange.enter(batch, mask, on_device(self._ladder, batch.device, batch.dtype))
        self.md.init_systems(batch, mask)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.md.pre_update(batch, mask)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.md.post_update(batch, mask)
        ladder = on_device(self._ladder, batch.device, batch.dtype)
        exchange.attempt(batch, mask, ladder, self.every, self.seed)


__all__ = ["CANONICAL", "ReplicaExchange", "tempered"]

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

The wrapped thermostat reads each system's temperature from the batch field
``rex_temperature`` (:class:`~.params.Rows`), so exchanging temperatures between two
rows is a write of two numbers; the move itself is :mod:`.exchange`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.state import Batch
from ..core.tensor_ops import on_device
from ..data.replicas import group_rows
from . import exchange
from .base import Integrator
from .bussi import Bussi
from .langevin import Langevin
from .md import MDIntegrator
from .nose_hoover import NoseHooverChain
from .params import Rows, check_count

#: thermostats that sample the canonical ensemble (what the acceptance assumes)
CANONICAL = (Langevin, Bussi, NoseHooverChain)


def check_ladder(owner: str, temperatures: Sequence[float]) -> list[float]:
    """A temperature ladder: at least 2 finite temperatures > 0 K, strictly increasing."""
    values = [float(t) for t in np.asarray(temperatures, dtype=np.float64).ravel()]
    if len(values) < 2:
        raise ConfigError(
            f"{owner}: a temperature ladder needs at least 2 temperatures (replicas), got "
            f"{values}; e.g. temperatures=geometric_ladder(300, 600, 8)"
        )
    if not all(math.isfinite(t) and t > 0 for t in values):
        raise ConfigError(f"{owner}: every ladder temperature must be finite and > 0 K, got {values}")
    steps = [k for k in range(len(values) - 1) if not values[k + 1] > values[k]]
    if steps:
        k = steps[0]
        raise ConfigError(
            f"{owner}: the ladder must increase strictly, but temperature {k + 1} "
            f"({values[k + 1]:g} K) is not above temperature {k} ({values[k]:g} K); sort it "
            f"(sorted(...)) and drop repeats"
        )
    return values


def geometric_ladder(t_min: float, t_max: float, n: int) -> list[float]:
    """``n`` temperatures from ``t_min`` to ``t_max`` (K) in a constant ratio: equal
    exchange acceptance between neighbours where the heat capacity is constant."""
    n = check_count("geometric_ladder", "n", n, 2, "the number of replicas")
    if not (0 < float(t_min) < float(t_max) and math.isfinite(float(t_max))):
        raise ConfigError(f"geometric_ladder: need 0 < t_min < t_max, got {t_min}, {t_max}")
    return np.geomspace(float(t_min), float(t_max), n).tolist()


class ReplicaExchange(Integrator):
    """Parallel tempering: ``md`` at a ladder of temperatures, one replica per rung,
    exchanges between neighbours every ``every`` steps (see :mod:`.exchange`).

    Args:
        md: a canonical thermostat (Langevin, Bussi, NoseHooverChain); its own
            ``temperature`` is replaced by the ladder, its ``steps`` is the stage's.
        temperatures: the ladder in K, strictly increasing, at least 2 (one per replica).
        every: steps between exchange attempts (>= 1); even and odd pairs alternate.
    """

    budget_name = "steps"

    def __init__(self, md: MDIntegrator, temperatures: Sequence[float], every: int = 100) -> None:
        owner = type(self).__name__
        if not isinstance(md, CANONICAL):
            names = ", ".join(c.__name__ for c in CANONICAL)
            raise ConfigError(
                f"{owner}: md must be a canonical thermostat ({names}), got {md!r}; the "
                f"exchange acceptance assumes the canonical ensemble (NVE, Berendsen and "
                f"barostats do not sample it)"
            )
        self._ladder = torch.tensor(check_ladder(owner, temperatures), dtype=torch.float64)
        self.every = check_count(owner, "every", every, 1, "steps between exchange attempts")
        super().__init__(md.max_steps)
        self.md = copy.copy(md)
        self.md.temperature = Rows(exchange.TEMPERATURE)
        self.fields = dict(md.fields)  # (the thermostat's: stage-private)

    @property
    def temperatures(self) -> list[float]:
        """The ladder (K), lowest first."""
        return self._ladder.tolist()

    @property
    def steps(self) -> int:
        return self.max_steps

    def __repr__(self) -> str:
        t = self.temperatures
        return f"ReplicaExchange({self.md!r}, {len(t)} replicas {t[0]:g}-{t[-1]:g} K, every={self.every})"

    def compile(self) -> None:
        super().compile()
        self.md.compile()

    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        """The thermostat's fields, the replica fields (kept with the results) and each
        new system's group and rung from its ``info`` (all replicas of a group must be
        in the batch: the sampler takes a group whole)."""
        self.seed = int(seed)
        self.md.setup(batch, seed, prefix)
        n = len(self._ladder)
        for name in (exchange.GROUP, exchange.RUNG, exchange.END):
            batch.ensure_field(name, "system", (), torch.int64, -1)
        batch.ensure_field(exchange.TRIPS, "system", (), torch.int64, 0)
        batch.ensure_field(exchange.TEMPERATURE, "system", (), None, float("nan"))
        for name in (exchange.ATTEMPTS, exchange.ACCEPTS):
            if batch.has_field(name) and getattr(batch, name).shape[1:] != (n - 1,):
                batch.drop_field(name)
            batch.ensure_field(name, "system", (n - 1,), torch.int64, 0)
        group, rung = getattr(batch, exchange.GROUP).clone(), getattr(batch, exchange.RUNG).clone()
        for g, rows in group_rows(batch, group < 0, n, type(self).__name__).items():
            for r, k in rows:
                group[r], rung[r] = g, k
        setattr(batch, exchange.GROUP, group)
        setattr(batch, exchange.RUNG, rung)

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        """Replicas entering: the temperature of their rung, counts at zero, then the
        thermostat's own entry (Maxwell-Boltzmann velocities at that temperature)."""
        ladder = on_device(self._ladder, batch.device, batch.dtype)
        rung = getattr(batch, exchange.RUNG)
        t = ladder.index_select(0, rung.clamp(0, len(ladder) - 1))
        setattr(batch, exchange.TEMPERATURE, torch.where(mask, t, getattr(batch, exchange.TEMPERATURE)))
        end = getattr(batch, exchange.END)
        setattr(batch, exchange.END, torch.where(mask, torch.where(rung == 0, 0, -1), end))
        trips = getattr(batch, exchange.TRIPS)
        setattr(batch, exchange.TRIPS, trips.masked_fill(mask, 0))
        for name in (exchange.ATTEMPTS, exchange.ACCEPTS):
            setattr(batch, name, getattr(batch, name).masked_fill(mask.unsqueeze(-1), 0))
        self.md.init_systems(batch, mask)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.md.pre_update(batch, mask)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.md.post_update(batch, mask)
        ladder = on_device(self._ladder, batch.device, batch.dtype)
        exchange.attempt(batch, mask, ladder, self.every, self.seed)

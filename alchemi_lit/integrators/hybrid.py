"""Hybrid MD/MC: a Monte Carlo attempt after every ``every`` MD steps, in one stage.

Why one stage and not ``md + mc``: in a plan ``a + b`` a system visits ``a`` and then
``b`` (stages run one after another, :mod:`.stages`); interleaving needs both in the
same stage.  :class:`Hybrid` runs its MD integrator's step on steps whose phase
``step mod (every + 1)`` is below ``every`` and its Monte Carlo move's step on the
others, each with its own mask, so the batch's one forward per step serves the MD step
of some systems and the MC proposal of others.  The MD integrator's state and the MC
chain's statistics live in batch fields, so the stage runs alone, fused (``FIRE() +
Hybrid(...)``) or on a pipeline rank (``|``) like any other.  An accepted swap keeps
each atom's kinetic energy (``v *= sqrt(m_old / m_new)``, LAMMPS ``ke yes``); a rejected
one restores forces and energy, so the next MD step continues from a consistent state.
"""

from __future__ import annotations

import torch

from ..core.errors import ConfigError
from ..core.state import Batch
from .base import Integrator
from .md import MDIntegrator
from .params import check_count, check_system_ids


class Hybrid(Integrator):
    """MD steps with a Monte Carlo attempt after every ``every`` of them.

    Args:
        md: the MD integrator (:class:`~.langevin.Langevin`, ...); its ``steps`` are the
            stage's MD steps.
        mc: the Monte Carlo move (:class:`~.swap_mc.SwapMC`,
            :class:`~.sgc_mc.SemiGrandMC`); its ``steps`` are ignored: the stage makes
            ``md.steps // every`` attempts, one after each ``every`` MD steps.
        every: MD steps between attempts, >= 1.
    """

    budget_name = "steps"

    def __init__(self, md: MDIntegrator, mc: Integrator, every: int = 10) -> None:
        if not isinstance(md, MDIntegrator):
            raise TypeError(f"Hybrid: md must be an MD integrator (Langevin(...)), got {md!r}")
        if not hasattr(mc, "_numbers"):
            raise TypeError(f"Hybrid: mc must be a Monte Carlo move (SwapMC(...)), got {mc!r}")
        if getattr(mc, "proposals", 1) > 1:
            raise ConfigError(
                f"Hybrid: {mc!r} has proposals > 1, whose copies of a chain the MD steps would "
                f"make differ (their noise is per system); give the Hybrid's move proposals=1"
            )
        self.every = check_count("Hybrid", "every", every, 1, "MD steps between attempts")
        super().__init__(md.steps + md.steps // self.every)
        self.md, self.mc = md, mc
        self.fields = {**md.fields, **mc.fields}
        self.requires_stress = getattr(md, "requires_stress", False)

    @property
    def steps(self) -> int:
        return self.max_steps

    def __repr__(self) -> str:
        return f"Hybrid({self.md!r}, {self.mc!r}, every={self.every})"

    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        ids = batch.system_id.tolist()  # per-system parameters of the inner stages (setup
        check_system_ids(self.md, ids)  # reads the host anyway): the Simulator's check
        check_system_ids(self.mc, ids)  # sees this stage's own attributes only
        self.seed = int(seed)
        self.md.setup(batch, seed, prefix)
        self.mc.setup(batch, seed, prefix)

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        self.md.init_systems(batch, mask)
        self.mc.init_systems(batch, mask)

    def turns(self, batch: Batch, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(MD systems, MC systems)`` of ``mask`` this step (no host read)."""
        mc_turn = batch.step % (self.every + 1) == self.every
        return mask & ~mc_turn, mask & mc_turn

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        md, mc = self.turns(batch, mask)
        self.md.pre_update(batch, md)
        self.mc.pre_update(batch, mc)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        md, mc = self.turns(batch, mask)
        self.md.post_update(batch, md)
        self.mc.post_update(batch, mc)

    def compile(self) -> None:
        super().compile()
        self.md.compile()
        self.mc.compile()


__all__ = ["Hybrid"]

"""Moved to :mod:`alchemi_lit.engine.step` (the fused step loop is the engine's);
kept importable from here for one release."""

from ..engine.status import PENDING, StatusMasks, failed_exit
from ..engine.step import FusedLoop

__all__ = ["PENDING", "FusedLoop", "StatusMasks", "failed_exit"]

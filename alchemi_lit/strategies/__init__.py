"""Strategies own devices and ranks: single-device fused runs, pipelines, replicas."""

from .base import Strategy
from .fused import FusedLoop
from .single import SingleDeviceStrategy

__all__ = ["FusedLoop", "SingleDeviceStrategy", "Strategy"]

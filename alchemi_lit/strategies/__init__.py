"""Strategies own devices and ranks: single-device fused runs, pipelines, replicas."""

from ..engine.step import FusedLoop
from .base import Strategy
from .distributed import DistributedStrategy, PipelineStrategy, ReplicasStrategy
from .single import SingleDeviceStrategy

__all__ = [
    "DistributedStrategy",
    "FusedLoop",
    "PipelineStrategy",
    "ReplicasStrategy",
    "SingleDeviceStrategy",
    "Strategy",
]

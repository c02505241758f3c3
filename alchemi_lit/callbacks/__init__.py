"""Callbacks bound to the step stages of HookStageEnum."""

from ..engine.hooks import Callback, HookStageEnum, LambdaCallback, StepContext
from ..io.trajectory_store import read_trajectory, trajectory_system_ids
from .checkpoint import Checkpoint, latest_checkpoint, load_checkpoint
from .logger import Logger
from .nan_guard import NaNGuard
from .progress import ProgressBar
from .thermo import ThermoMonitor
from .trajectory import TrajectoryWriter

__all__ = [
    "Callback",
    "Checkpoint",
    "HookStageEnum",
    "LambdaCallback",
    "Logger",
    "NaNGuard",
    "ProgressBar",
    "StepContext",
    "ThermoMonitor",
    "TrajectoryWriter",
    "latest_checkpoint",
    "load_checkpoint",
    "read_trajectory",
    "trajectory_system_ids",
]

"""Callbacks bound to the step stages of HookStageEnum."""

from ..engine.hooks import Callback, HookStageEnum, LambdaCallback, StepContext
from ..io.trajectory_store import read_trajectory, trajectory_system_ids
from .averages import BlockAverages
from .checkpoint import Checkpoint, latest_checkpoint, load_checkpoint
from .correlation import MSD, VACF
from .logger import Logger
from .nan_guard import NaNGuard
from .observables import Observable
from .progress import ProgressBar
from .rdf import RDF
from .thermo import ThermoMonitor
from .trajectory import TrajectoryWriter

__all__ = [
    "MSD",
    "RDF",
    "VACF",
    "BlockAverages",
    "Callback",
    "Checkpoint",
    "HookStageEnum",
    "LambdaCallback",
    "Logger",
    "NaNGuard",
    "Observable",
    "ProgressBar",
    "StepContext",
    "ThermoMonitor",
    "TrajectoryWriter",
    "latest_checkpoint",
    "load_checkpoint",
    "read_trajectory",
    "trajectory_system_ids",
]

"""Registers the built-in plugins (imported once by the registry, lazily).

Kept in one place so that importing a low layer never pulls in the registry of
everything, and so `alchemi-lit plugins` shows exactly this list plus entry points.
"""

from __future__ import annotations

from .callbacks import (
    MSD,
    RDF,
    VACF,
    BlockAverages,
    Checkpoint,
    Logger,
    NaNGuard,
    ProgressBar,
    ThermoMonitor,
    TrajectoryWriter,
)
from .core.registry import register, register_preset
from .data import SizeAwareSampler
from .integrators import (
    BFGS,
    FIRE,
    FIRE2,
    LBFGS,
    MTKNPT,
    Berendsen,
    Bussi,
    CRescale,
    Hybrid,
    Langevin,
    NoseHooverChain,
    NPTLangevin,
    ReplicaExchange,
    SemiGrandMC,
    SwapMC,
    VelocityVerlet,
)
from .integrators.convergence import All, Any_, EnergyChange, ForceMax
from .models import EMT, ASECalculatorModel, LennardJones, Morse
from .sinks import HostMemory, ZarrSink
from .strategies.distributed import PipelineStrategy, ReplicasStrategy
from .strategies.single import SingleDeviceStrategy

for _cls in (FIRE, FIRE2, BFGS, LBFGS, VelocityVerlet, Langevin, NoseHooverChain, Berendsen, Bussi):
    register("integrator")(_cls)
for _cls in (MTKNPT, CRescale, NPTLangevin, SwapMC, SemiGrandMC, Hybrid, ReplicaExchange):
    register("integrator")(_cls)
register_preset("integrator", "fire-ase", FIRE, mode="ase")
register_preset("integrator", "fire-mass-weighted", FIRE, mode="mass_weighted")

for _cls in (LennardJones, Morse, EMT, ASECalculatorModel):
    register("model")(_cls)
register_preset("model", "lj-argon", LennardJones, epsilon=0.0104, sigma=3.40, cutoff=8.5)

for _cls in (NaNGuard, Logger, ProgressBar, TrajectoryWriter, ThermoMonitor, Checkpoint):
    register("callback")(_cls)
for _cls in (RDF, MSD, VACF, BlockAverages):
    register("callback")(_cls)
for _cls in (HostMemory, ZarrSink):
    register("sink")(_cls)
register("sampler")(SizeAwareSampler)

# strategy="auto" is not a class: the Simulator picks pipeline or single by the plan
register("strategy", "single")(SingleDeviceStrategy)
register("strategy", "pipeline")(PipelineStrategy)
register("strategy", "replicas")(ReplicasStrategy)

for _cls in (ForceMax, EnergyChange, All):
    register("criterion")(_cls)
register("criterion", "Any")(Any_)

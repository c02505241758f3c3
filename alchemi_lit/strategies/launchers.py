"""Which external launcher started this process -- torchrun or SLURM's srun -- and its ranks.

A launcher starts every rank with the user's command itself, so nothing is spawned:
the ranks only need to agree on who they are.  torchrun says so with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and ``MASTER_ADDR``; srun with
``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NTASKS_PER_NODE`` and
``SLURM_NNODES`` (the variables Lightning Fabric's ``SLURMEnvironment`` reads; it finds
the main node in ``SLURM_NODELIST`` unless ``MASTER_ADDR`` is set).  Fabric prefers
SLURM when both are present; we prefer torchrun (a torchrun inside one srun task is a
torchrun launch) and hand Fabric the matching cluster environment explicitly, so the
two cannot disagree.  A job named ``bash`` or ``interactive`` is not a srun launch (as in
Fabric): there Fabric starts the ranks itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
_INTERACTIVE_JOBS = ("bash", "interactive")


@dataclass(frozen=True)
class ExternalLaunch:
    """The ranks an external launcher gave this process (see the module docstring)."""

    launcher: str  # "torchrun" or "slurm"
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    num_nodes: int

    def cluster_environment(self) -> Any:
        """The Lightning Fabric cluster environment of this launcher."""
        from lightning_fabric.plugins.environments import (
            SLURMEnvironment,
            TorchElasticEnvironment,
        )

        if self.launcher == "slurm":
            return SLURMEnvironment(auto_requeue=False)
        return TorchElasticEnvironment()

    def refuse_world(self, needed: int) -> None:
        """A clear error when the launcher started another number of ranks than the plan
        has (each rank of a plan is one process)."""
        if self.world_size == needed:
            return
        if self.launcher == "slurm":
            raise ValueError(
                f"the plan needs {needed} ranks but SLURM started {self.world_size} task(s) "
                f"(SLURM_NTASKS={self.world_size}); run it with srun and as many tasks as "
                f"ranks (#SBATCH --nodes=N --ntasks-per-node=M with N*M={needed}), or without "
                f"srun under --job-name=interactive to let Fabric start the ranks on one node"
            )
        raise ValueError(
            f"the plan needs {needed} ranks but {self.world_size} were launched "
            f"(WORLD_SIZE={self.world_size}); launch with --nnodes * --nproc_per_node "
            f"equal to the plan's ranks"
        )


def external_launch() -> ExternalLaunch | None:
    """The launch torchrun or srun made of this process, or None (a plain process)."""
    env = os.environ
    if all(k in env for k in _TORCHRUN):
        world = int(env["WORLD_SIZE"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        return ExternalLaunch(
            "torchrun", int(env["RANK"]), int(env["LOCAL_RANK"]), world, local_world,
            max(1, world // max(local_world, 1)),
        )  # fmt: skip
    if "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in _INTERACTIVE_JOBS:
        return _slurm(env)
    return None


def _slurm(env: Any) -> ExternalLaunch:
    world = int(env["SLURM_NTASKS"])
    nodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    if per_node is None and world > 1:
        raise ValueError(
            f"SLURM started {world} tasks without --ntasks-per-node (SLURM_NTASKS_PER_NODE "
            f"is unset); Lightning Fabric needs it: use #SBATCH --nodes=N and "
            f"--ntasks-per-node=M (one task per rank) instead of --ntasks"
        )
    local_world = world if per_node is None else int(str(per_node).split("(")[0])
    try:
        rank, local = int(env["SLURM_PROCID"]), int(env["SLURM_LOCALID"])
    except KeyError as exc:
        raise ValueError(
            f"SLURM_NTASKS is set but {exc.args[0]} is not: start the ranks with srun "
            f"(srun alchemi-lit run ...), not from the batch script itself"
        ) from None
    return ExternalLaunch("slurm", rank, local, world, local_world, nodes)
